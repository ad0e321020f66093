import { execFile } from "node:child_process";
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

// Runs the real, bundled `llmgw agent inventory` against a fake nvidia-smi executable and a
// sysfs tree in a temp dir. The CLI is bundled by the CLI's own tsup config into a private
// directory under apps/cli/node_modules/.cache (npm externals resolve from apps/cli, and a
// concurrent `pnpm --filter llmgw build` cleaning apps/cli/dist cannot pull it away mid-test).

const cliDir = fileURLToPath(new URL("../../cli/", import.meta.url));
const fixtures = fileURLToPath(
  new URL("../../../packages/discovery/test/fixtures/", import.meta.url),
);

let work: string;
let outDir: string;
let fakeSmi: string;
let sysfsRoot: string;

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

function llmgw(args: string[], env: NodeJS.ProcessEnv = process.env): Promise<Run> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [join(outDir, "main.js"), ...args],
      { env, timeout: 60_000 },
      (error, stdout, stderr) => {
        const code = error ? (typeof error.code === "number" ? error.code : -1) : 0;
        resolve({ code, stdout, stderr });
      },
    );
  });
}

async function tree(root: string, files: Record<string, string | null>): Promise<void> {
  for (const [rel, content] of Object.entries(files)) {
    const path = join(root, rel);
    if (content === null) {
      await mkdir(path, { recursive: true });
    } else {
      await mkdir(dirname(path), { recursive: true });
      await writeFile(path, content);
    }
  }
}

beforeAll(async () => {
  work = await mkdtemp(join(tmpdir(), "llmgw-inventory-cli-"));
  outDir = join(cliDir, "node_modules", ".cache", `llmgw-inventory-test-${process.pid}`);
  await new Promise<void>((resolve, reject) => {
    execFile(
      "pnpm",
      ["exec", "tsup", "--out-dir", outDir],
      { cwd: cliDir },
      (error, _out, stderr) =>
        error ? reject(new Error(`building the CLI failed: ${stderr}`)) : resolve(),
    );
  });
  const rules = [
    {
      when: ["--query-gpu"],
      stdout:
        (await readFile(join(fixtures, "query-gpu-h100-idle.txt"), "utf8")) +
        "1, GPU-11111111-2222-3333-4444-555555555555, NVIDIA H100 80GB HBM3, 81559, [N/A], 00000000:0A:00.0, 9.0, 2, [Unknown Error], [N/A], Disabled, [N/A]\n",
    },
    { when: ["--query-compute-apps"], stdout: "" },
    {
      when: ["topo", "-m"],
      stdout: await readFile(join(fixtures, "topo-h200-single.txt"), "utf8"),
    },
  ];
  fakeSmi = join(work, "nvidia-smi");
  await writeFile(
    fakeSmi,
    `#!${process.execPath}
const rules = ${JSON.stringify(rules)};
const joined = process.argv.slice(2).join(" ");
const rule = rules.find((r) => r.when.every((w) => joined.includes(w))) || {};
process.stdout.write(rule.stdout || "");
`,
  );
  await chmod(fakeSmi, 0o755);
  sysfsRoot = join(work, "infiniband");
  const zero = "0000:0000:0000:0000:0000:0000:0000:0000\n";
  await tree(sysfsRoot, {
    "mlx5_0/ports/1/state": "4: ACTIVE\n",
    "mlx5_0/ports/1/phys_state": "5: LinkUp\n",
    "mlx5_0/ports/1/link_layer": "InfiniBand\n",
    "mlx5_0/ports/1/rate": "400 Gb/sec (4X NDR)\n",
    "mlx5_0/ports/1/sm_lid": "0x1\n",
    "mlx5_0/ports/1/gids/0": "fe80:0000:0000:0000:506b:4b03:00f5:ce9c\n",
    "mlx5_0/device/net/ibp12s0": null,
    "rocep193s0f0/ports/1/state": "4: ACTIVE\n",
    "rocep193s0f0/ports/1/phys_state": "5: LinkUp\n",
    "rocep193s0f0/ports/1/link_layer": "Ethernet\n",
    "rocep193s0f0/ports/1/rate": "200 Gb/sec (4X HDR)\n",
    "rocep193s0f0/ports/1/gids/0": "fe80:0000:0000:0000:0ac0:ebff:fe21:03da\n",
    "rocep193s0f0/ports/1/gids/1": "0000:0000:0000:0000:0000:ffff:0ac8:010a\n",
    "rocep193s0f0/ports/1/gids/2": zero,
    "rocep193s0f0/ports/1/gid_attrs/types/0": "IB/RoCE v1\n",
    "rocep193s0f0/ports/1/gid_attrs/types/1": "RoCE v2\n",
    "rocep193s0f0/ports/1/gid_attrs/types/2": null,
    "rocep193s0f0/ports/1/gid_attrs/ndevs/1": "ens1f0np0\n",
    "mlx5_bond_0/ports/1/state": "1: DOWN\n",
    "mlx5_bond_0/ports/1/phys_state": "3: Disabled\n",
    "mlx5_bond_0/ports/1/link_layer": "Ethernet\n",
  });
}, 180_000);

afterAll(async () => {
  if (work) await rm(work, { recursive: true, force: true });
  if (outDir) await rm(outDir, { recursive: true, force: true });
});

describe("llmgw agent inventory (built CLI)", () => {
  it("with no flags on a GPU-less machine: empty inventory, 'nvidia-smi not found', exit 0", async () => {
    const env = { ...process.env, PATH: dirname(process.execPath) };
    const { code, stdout } = await llmgw(
      ["agent", "inventory", "--sysfs-root", join(work, "none")],
      env,
    );
    expect(code).toBe(0);
    expect(stdout).toContain("GPUs (0)");
    expect(stdout).toContain(
      "LLMGW_DISCOVERY_NVIDIA_SMI_NOT_FOUND  nvidia-smi not found (nvidia-smi)",
    );
  });

  it("--json against the fake nvidia-smi and sysfs tree carries the issue's fields", async () => {
    const { code, stdout, stderr } = await llmgw([
      "agent",
      "inventory",
      "--json",
      "--nvidia-smi",
      fakeSmi,
      "--sysfs-root",
      sysfsRoot,
      "--fabric-name",
      "mlx5_0=ib-a",
      // Exact problems below: this machine's own kernel log stays out of it.
      "--kernel-log",
      "off",
    ]);
    expect(stderr).toBe("");
    expect(code).toBe(0);
    const inv = JSON.parse(stdout);
    expect(typeof inv.hostname).toBe("string");
    expect(inv.gpus).toHaveLength(2);
    expect(inv.gpus[0]).toMatchObject({
      index: 0,
      uuid: "GPU-00000000-0000-0000-0000-000000000000",
      name: "NVIDIA H100 80GB HBM3",
      gpuClass: "h100-80g",
      memoryTotalBytes: String(81559 * 1024 * 1024),
      memoryUsedBytes: "0",
      computeCapability: "9.0",
      utilizationPercent: 0,
      eccUncorrectedErrors: "0",
      healthy: true,
      healthProblems: [],
    });
    const second = inv.gpus[1];
    expect(second).toMatchObject({ index: 1, healthy: false, eccUncorrectedErrors: "2" });
    expect(second.healthProblems.map((p: { code: string }) => p.code)).toEqual([
      "LLMGW_DISCOVERY_GPU_ECC_UNCORRECTED",
    ]);
    for (const key of [
      "memoryUsedBytes",
      "utilizationPercent",
      "temperatureCelsius",
      "powerWatts",
    ]) {
      expect(second, key).not.toHaveProperty(key);
    }
    expect(inv.fabrics.map((f: { id: string; linkLayer: string }) => [f.id, f.linkLayer])).toEqual([
      ["ib-a", "infiniband"],
      ["roce:10.200.1.0/24", "roce"],
    ]);
    expect(inv.fabrics[0].ports[0]).toMatchObject({
      device: "mlx5_0",
      port: 1,
      state: "ACTIVE",
      rateGbps: 400,
      netdev: "ibp12s0",
    });
    expect(inv.fabrics[0].ports[0]).not.toHaveProperty("gidIndex");
    expect(inv.fabrics[1].ports[0]).toMatchObject({
      device: "rocep193s0f0",
      port: 1,
      state: "ACTIVE",
      rateGbps: 200,
      netdev: "ens1f0np0",
      gidIndex: 1,
    });
    expect(inv.inactivePorts.map((p: { device: string }) => p.device)).toEqual(["mlx5_bond_0"]);
    expect(inv.topology.gpuAffinity).toEqual([{ gpu: 0, cpuAffinity: "0-23", numaNode: 0 }]);
    expect(inv.problems.map((p: { code: string; message: string }) => [p.code, p.message])).toEqual(
      [
        [
          "LLMGW_DISCOVERY_ROCE_PREFIX_ASSUMED",
          "prefix length of 10.200.1.10 on ens1f0np0 (rocep193s0f0 port 1) unknown; assumed /24 for the fabric id",
        ],
      ],
    );
  });

  it("human output: GPU and port tables, '-' for unreported values", async () => {
    const { code, stdout } = await llmgw([
      "agent",
      "inventory",
      "--nvidia-smi",
      fakeSmi,
      "--sysfs-root",
      sysfsRoot,
    ]);
    expect(code).toBe(0);
    expect(stdout).toMatch(
      / {2}0 +NVIDIA H100 80GB HBM3 +h100-80g +0\.0 GiB \/ 79\.6 GiB +0% +41C +0 +ok/,
    );
    expect(stdout).toMatch(
      / {2}1 +NVIDIA H100 80GB HBM3 +h100-80g +- \/ 79\.6 GiB +- +- +2 +ecc-errors/,
    );
    expect(stdout).toMatch(
      /mlx5_0 +1 +ib:fe80:0000:0000:0000:0x1 +IB +ACTIVE\/LinkUp +400 Gb\/s +ibp12s0/,
    );
    expect(stdout).toMatch(/mlx5_bond_0 +1 +- +RoCE +DOWN\/Disabled +- +-/);
  });

  it("--simulate 8xh100-80g@ib-a --json: a simulated node on fabric ib-a", async () => {
    const { code, stdout } = await llmgw([
      "agent",
      "inventory",
      "--simulate",
      "8xh100-80g@ib-a",
      "--json",
    ]);
    expect(code).toBe(0);
    const inv = JSON.parse(stdout);
    expect(inv.simulated).toBe(true);
    expect(inv.gpus.map((g: { gpuClass: string }) => g.gpuClass)).toEqual(
      Array(8).fill("h100-80g"),
    );
    expect(inv.fabrics[0].id).toBe("ib-a");
    expect(inv.fabrics[0].ports).toHaveLength(8);
  });

  it("--kernel-log FILE: faults in the HEALTH column and as `faults` in --json", async () => {
    const log = join(work, "kern.log");
    // Verbatim lines from shared/reference/health-formats.md §1.3 (open-gpu-kernel-modules#1151
    // and dxvk#1027); simulated GPU i sits at bus i+1, so 0000:06:00 is GPU 5, 0000:01:00 GPU 0.
    await writeFile(
      log,
      [
        "[  365.969681] NVRM: Xid (PCI:0000:01:00): 31, pid=13705, name=UnrealEditor, channel 0x0000000c, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_PROP_0 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
        "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.",
        "NVRM: GPU 0000:06:00.0: GPU has fallen off the bus.",
        "",
      ].join("\n"),
    );
    const text = await llmgw([
      "agent",
      "inventory",
      "--simulate",
      "6xh100-80g",
      "--kernel-log",
      log,
    ]);
    expect(text.code).toBe(0);
    expect(text.stdout).toMatch(/ {2}0 +NVIDIA H100 80GB HBM3 .* xid-79$/m);
    expect(text.stdout).toMatch(/ {2}5 +NVIDIA H100 80GB HBM3 .* xid-79$/m);

    const json = await llmgw([
      "agent",
      "inventory",
      "--simulate",
      "6xh100-80g",
      "--kernel-log",
      log,
      "--json",
    ]);
    const inv = JSON.parse(json.stdout);
    expect(
      inv.gpus[0].faults.map((f: { code: number; action: string }) => [f.code, f.action]),
    ).toEqual([
      [31, "restart-engine"],
      [79, "reboot"],
    ]);
    expect(inv.gpus[5].faults).toHaveLength(1);
    expect(inv.gpus[5].faults[0]).toMatchObject({
      kind: "xid",
      code: 79,
      pciBusId: "00000000:06:00.0",
      count: 1,
      evidence: "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.",
      description: "GPU has fallen off the bus",
    });
    expect(inv.gpus.every((g: { healthy: boolean }) => !g.healthy)).toBe(true);
    expect(inv.problems).toEqual([]);

    const missing = await llmgw([
      "agent",
      "inventory",
      "--simulate",
      "1xh100-80g",
      "--kernel-log",
      join(work, "no-such.log"),
    ]);
    expect(missing.code).toBe(0);
    expect(missing.stdout).toContain(
      `LLMGW_DISCOVERY_KERNEL_LOG_UNREADABLE  cannot open the kernel log ${join(work, "no-such.log")} (ENOENT)`,
    );
  });

  it.each([
    [["--simulate", "8h100"], 'invalid simulate spec "8h100"'],
    [
      ["--fabric-name", "mlx5_0"],
      '--fabric-name expects DEV=ID (e.g. mlx5_0=rail-0), got "mlx5_0"',
    ],
    [["--bogus"], "Unknown option '--bogus'"],
  ])("%j is a usage error (exit 2)", async (args, message) => {
    const { code, stderr } = await llmgw(["agent", "inventory", ...args]);
    expect(code).toBe(2);
    expect(stderr).toContain(message);
  });
});
