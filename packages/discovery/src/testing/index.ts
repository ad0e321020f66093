// Fakes for tests here and in other packages ("@llmgw/discovery/testing"): a real fake
// nvidia-smi executable and a sysfs tree writer. Not re-exported from the package root.
export {
  type FakeNvidiaSmiRule,
  stripFixtureComments,
  type TreeEntry,
  writeFakeNvidiaSmi,
  writeTree,
} from "./fake-nvidia-smi.js";
