import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { MIGRATIONS } from "@llmgw/control-plane";
import { LLMGW_VERSION } from "@llmgw/wire";
import { describe, expect, it } from "vitest";
import { command, versionInfo } from "./commands/version.js";
import { capturedIo } from "./testing.js";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");

describe("one version for the whole system", () => {
  it("every workspace package carries LLMGW_VERSION, and CHANGELOG.md has its entry", () => {
    const manifests = ["apps", "packages"]
      .flatMap((d) => readdirSync(join(root, d)).map((p) => join(root, d, p, "package.json")))
      .concat(join(root, "bench", "package.json"));
    const off = manifests
      .map((f) => [f.slice(root.length + 1), JSON.parse(readFileSync(f, "utf8")).version] as const)
      .filter(([, v]) => v !== LLMGW_VERSION);
    expect(off).toEqual([]);
    expect(readFileSync(join(root, "CHANGELOG.md"), "utf8")).toMatch(
      new RegExp(`^## ${LLMGW_VERSION.replace(/\./g, "\\.")}\\b`, "m"),
    );
  });

  it("llmgw version --json names the version, the wire package and the store schema", async () => {
    const io = capturedIo({});
    expect(await command.run(["--json"], io)).toBe(0);
    const v = JSON.parse(io.out());
    expect(v).toEqual(versionInfo());
    expect(v.version).toBe(LLMGW_VERSION);
    expect(v.proto).toBe("llmgw.v1");
    expect(v.storeSchema).toBe(MIGRATIONS.length);
    // Run from source, not a built bundle: no commit to name.
    expect(v.commit).toBeUndefined();
  });
});
