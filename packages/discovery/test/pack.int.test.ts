import { execFile } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const run = promisify(execFile);
const packageDir = fileURLToPath(new URL("..", import.meta.url));

// Proves the published artifact works on its own: build with tsup, `npm pack`, install the
// tarball offline into a plain Node project, import it from plain JavaScript.
describe("the packed @llmgw/discovery tarball", () => {
  let work: string;
  let project: string;

  beforeAll(async () => {
    work = await mkdtemp(join(tmpdir(), "llmgw-pack-"));
    project = join(work, "consumer");
    await run("pnpm", ["run", "build"], { cwd: packageDir });
    const { stdout } = await run("npm", ["pack", "--json", "--pack-destination", work], {
      cwd: packageDir,
    });
    const [packed] = JSON.parse(stdout) as { filename: string }[];
    await run("mkdir", ["-p", project]);
    await writeFile(
      join(project, "package.json"),
      JSON.stringify({ name: "consumer", version: "1.0.0", private: true, type: "module" }),
    );
    await run(
      "npm",
      [
        "install",
        "--offline",
        "--no-audit",
        "--no-fund",
        join(work, packed?.filename ?? "missing.tgz"),
      ],
      { cwd: project },
    );
  }, 180_000);

  afterAll(async () => {
    if (work) await rm(work, { recursive: true, force: true });
  });

  it("imports from plain JS and works", async () => {
    await writeFile(
      join(project, "check.mjs"),
      `import { deriveGpuClass, simulateInventory, discoverNode, isDiscoveryError, parseSimulateSpec } from "@llmgw/discovery";
const inv = await discoverNode({ nvidiaSmiPath: "/nonexistent/nvidia-smi", sysfsRoot: "/nonexistent" });
let code;
try { parseSimulateSpec("nope"); } catch (e) { code = isDiscoveryError(e) ? e.code : "not branded"; }
console.log(JSON.stringify({
  cls: deriveGpuClass("NVIDIA H200", 143771),
  sim: simulateInventory("2xh100-80g@ib-a").gpus.map((g) => g.gpuClass),
  problems: inv.problems.map((p) => p.code),
  code,
}));
`,
    );
    const { stdout } = await run(process.execPath, ["check.mjs"], { cwd: project });
    expect(JSON.parse(stdout)).toEqual({
      cls: "h200-141g",
      sim: ["h100-80g", "h100-80g"],
      problems: ["LLMGW_DISCOVERY_NVIDIA_SMI_NOT_FOUND"],
      code: "LLMGW_DISCOVERY_INVALID_SIMULATE_SPEC",
    });
  });

  it("ships type declarations and no sources or tests", async () => {
    const { stdout } = await run("npm", ["pack", "--dry-run", "--json"], { cwd: packageDir });
    const files =
      (JSON.parse(stdout) as { files: { path: string }[] }[])[0]?.files.map((f) => f.path) ?? [];
    expect(files).toContain("dist/index.d.ts");
    expect(files).toContain("dist/index.js");
    expect(files.filter((f) => f.startsWith("src/") || f.startsWith("test/"))).toEqual([]);
  });
});
