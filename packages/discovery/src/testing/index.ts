// Fakes for tests here and in other packages: a real fake nvidia-smi executable and a sysfs
// tree writer. Not re-exported from the package root (no `./testing` export map entry yet).
export {
  type FakeNvidiaSmiRule,
  stripFixtureComments,
  type TreeEntry,
  writeFakeNvidiaSmi,
  writeTree,
} from "./fake-nvidia-smi.js";
