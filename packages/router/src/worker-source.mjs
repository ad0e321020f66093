// Worker bootstrap used when running from TypeScript source (tests, tsx): Node 20 does not
// apply `--import tsx` hooks to a worker's entry module, so register tsx here, then load the
// real entry. Bundles use the compiled `worker.js` / `router-worker.js` instead.
import { register } from "tsx/esm/api";

register();
const entry = await import("./worker.ts");
export default entry.default;
