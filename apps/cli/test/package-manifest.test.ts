// scripts/package.ts refuses to pack when apps/cli's dependencies and the bundle's imports
// disagree: both directions, with builtins, subpaths and relative chunks told apart.
import { describe, expect, it } from "vitest";
import { bundleImports, dependencyMismatches, packageOf } from "../../../scripts/package.js";

describe("the package's dependency check", () => {
  it("names the npm package of a bare specifier, scoped or not", () => {
    expect(packageOf("@connectrpc/connect/protocol")).toBe("@connectrpc/connect");
    expect(packageOf("zod")).toBe("zod");
    expect(packageOf("yaml/util")).toBe("yaml");
  });

  it("takes only external npm imports from esbuild's metafile", () => {
    const metafile = {
      outputs: {
        "dist/main.js": {
          imports: [
            { path: "./chunk-A.js" },
            { path: "node:fs", external: true },
            { path: "child_process", external: true },
            { path: "fs/promises", external: true },
            { path: "@bufbuild/protobuf/wire", external: true },
            { path: "zod", external: true },
          ],
        },
        "dist/chunk-A.js": {
          imports: [
            { path: "zod", external: true },
            { path: "pg", external: true },
          ],
        },
      },
    };
    expect(bundleImports(metafile)).toEqual(["@bufbuild/protobuf", "pg", "zod"]);
  });

  it("refuses an import without a dependency, and a dependency nothing imports", () => {
    expect(dependencyMismatches(["pg", "zod"], ["pg", "zod"])).toEqual([]);
    expect(dependencyMismatches(["pg", "zod"], ["pg", "yaml"])).toEqual([
      "the bundle imports zod, which apps/cli/package.json does not depend on",
      "apps/cli/package.json depends on yaml, which the bundle never imports",
    ]);
  });
});
