export {
  collectInventory,
  formatInventoryTable,
  type InventoryOptions,
  inventoryToJson,
  toProtoInventory,
} from "./inventory.js";
