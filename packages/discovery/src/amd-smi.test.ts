import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { type AmdGpuQueryContext, buildAmdGpus, orderAmdGpus, queryAmdGpus } from "./amd-smi.js";
import type { AmdGpuFacts } from "./amd-smi-parse.js";
import type { CommandResult, CommandRunner } from "./command-runner.js";

const fixture = (name: string) =>
  readFileSync(new URL(`../test/fixtures/${name}`, import.meta.url), "utf8")
    .split("\n")
    .filter((line) => !line.startsWith("#"))
    .join("\n");

const ok = (stdout: string, exitCode = 0, stderr = ""): CommandResult => ({
  exitCode,
  stdout,
  stderr,
  timedOut: false,
  notFound: false,
});
const NOT_FOUND: CommandResult = {
  exitCode: undefined,
  stdout: "",
  stderr: "spawn amd-smi ENOENT",
  timedOut: false,
  notFound: true,
};
const TIMED_OUT: CommandResult = { ...NOT_FOUND, stderr: "", notFound: false, timedOut: true };

/** A runner answering by `<file> <args>`; anything unlisted is not installed. Records calls. */
function runner(answers: Record<string, CommandResult>): CommandRunner & { calls: string[] } {
  const calls: string[] = [];
  return {
    calls,
    async run(file, args) {
      const key = `${file} ${args.join(" ")}`;
      calls.push(key);
      return answers[key] ?? NOT_FOUND;
    },
  };
}

const context = (r: CommandRunner): AmdGpuQueryContext => ({
  runner: r,
  amdSmiPath: "amd-smi",
  rocmSmiPath: "rocm-smi",
  timeoutMs: 5000,
});

const AMD_SMI_OK = {
  "amd-smi list --json": ok(fixture("amd-smi-list-mi210.txt")),
  "amd-smi static --json": ok(fixture("amd-smi-static-mi350x.txt")),
  "amd-smi metric --json": ok(fixture("amd-smi-metric-radeon-gpu-data.txt")),
};
const ROCM_SMI_OK = {
  "rocm-smi --showallinfo --json": ok(fixture("amd-rocm-smi-phoenix3.txt")),
};

const facts = (toolIndex: number, extra: Partial<AmdGpuFacts> = {}): AmdGpuFacts => ({
  toolIndex,
  pciBusId: `00000000:0${toolIndex}:00.0`,
  ...extra,
});

describe("buildAmdGpus", () => {
  it("builds a vendor-amd GPU from the assembled list+static+metric documents", async () => {
    const report = await queryAmdGpus(context(runner(AMD_SMI_OK)));
    expect(report.problems).toEqual([]);
    expect(report.tool).toBe("amd-smi");
    expect(report.gpus).toEqual([
      {
        index: 0,
        uuid: "67ff740f-0000-1000-80e6-b5bb3c3ce0db",
        name: "AMD Instinct MI350X",
        gpuClass: "mi350x-30g",
        pciBusId: "00000000:23:00.0",
        memoryTotalBytes: 30576 * 1024 * 1024,
        migEnabled: false,
        memoryUsedBytes: 20450 * 1024 * 1024,
        utilizationPercent: 91,
        eccUncorrectedErrors: 0,
        temperatureCelsius: 63,
        healthy: true,
        healthProblems: [],
        lost: false,
        vendor: "amd",
        health: {
          eccDeferredErrors: 0,
          pcieLinkGenCurrent: 1,
          pcieLinkGenMax: 5,
          pcieLinkWidthCurrent: 8,
        },
      },
    ]);
  });

  it("uncorrectable RAS errors make the GPU unhealthy; deferred ones are a reading", () => {
    const [gpu] = buildAmdGpus([facts(0, { eccUncorrectable: 3, eccDeferred: 7 })], "amd-smi");
    expect(gpu?.healthy).toBe(false);
    expect(gpu?.healthProblems).toEqual([
      {
        code: "LLMGW_DISCOVERY_GPU_RAS_UNCORRECTED",
        source: "amd-smi",
        message: "GPU 0 (00000000:00:00.0) has 3 uncorrectable ECC errors (RAS)",
      },
    ]);
    expect(gpu?.health).toEqual({ eccDeferredErrors: 7 });
  });

  it("absent readings stay absent: no class without a name or memory, no health block", () => {
    const [gpu] = buildAmdGpus([facts(0)], "rocm-smi");
    expect(gpu).toEqual({
      index: 0,
      uuid: "AMD-00000000:00:00.0",
      name: "",
      pciBusId: "00000000:00:00.0",
      migEnabled: false,
      healthy: true,
      healthProblems: [],
      lost: false,
      vendor: "amd",
    });
  });

  it("numbers GPUs in KFD node order (ROCr/HIP order), not amd-smi's discovery order", () => {
    const gpus = buildAmdGpus(
      [facts(0, { kfdNodeId: 3 }), facts(1, { kfdNodeId: 2 }), facts(2, { kfdNodeId: 4 })],
      "amd-smi",
    );
    expect(gpus.map((g) => [g.index, g.pciBusId])).toEqual([
      [0, "00000000:01:00.0"],
      [1, "00000000:00:00.0"],
      [2, "00000000:02:00.0"],
    ]);
  });

  it("falls back to amd-smi's index when any entry lacks a node id", () => {
    const ordered = orderAmdGpus([facts(1, { kfdNodeId: 2 }), facts(0)]);
    expect(ordered.map((f) => f.toolIndex)).toEqual([0, 1]);
  });

  it("a uuid shared by partitions is not an identity: those GPUs get AMD-<BDF>", () => {
    const gpus = buildAmdGpus(
      [facts(0, { uuid: "u" }), facts(1, { uuid: "u" }), facts(2, { uuid: "v" })],
      "amd-smi",
    );
    expect(gpus.map((g) => g.uuid)).toEqual(["AMD-00000000:00:00.0", "AMD-00000000:01:00.0", "v"]);
  });

  it("indexes start at the offset (NVIDIA GPUs on the same node come first)", () => {
    expect(buildAmdGpus([facts(0), facts(1)], "amd-smi", 8).map((g) => g.index)).toEqual([8, 9]);
  });
});

describe("queryAmdGpus: amd-smi, then rocm-smi", () => {
  it("neither tool installed: no GPUs and no problem (a node without AMD GPUs)", async () => {
    const r = runner({});
    expect(await queryAmdGpus(context(r))).toEqual({ gpus: [], problems: [] });
    expect(r.calls).toEqual([
      "amd-smi list --json",
      "amd-smi static --json",
      "amd-smi metric --json",
      "rocm-smi --showallinfo --json",
    ]);
  });

  it("amd-smi not installed: rocm-smi answers, without a problem", async () => {
    const report = await queryAmdGpus(context(runner(ROCM_SMI_OK)));
    expect(report.tool).toBe("rocm-smi");
    expect(report.problems).toEqual([]);
    expect(report.gpus.map((g) => [g.index, g.pciBusId, g.name, g.vendor])).toEqual([
      [0, "00000000:C4:00.0", "Phoenix3", "amd"],
    ]);
  });

  it("amd-smi hangs on every run: LLMGW_DISCOVERY_AMD_SMI_FAILED, then rocm-smi", async () => {
    const report = await queryAmdGpus(
      context(
        runner({
          "amd-smi list --json": TIMED_OUT,
          "amd-smi static --json": TIMED_OUT,
          "amd-smi metric --json": TIMED_OUT,
          ...ROCM_SMI_OK,
        }),
      ),
    );
    expect(report.tool).toBe("rocm-smi");
    expect(report.gpus).toHaveLength(1);
    expect(report.problems.map((p) => [p.code, p.message])).toEqual(
      ["list", "static", "metric"].map((c) => [
        "LLMGW_DISCOVERY_AMD_SMI_FAILED",
        `amd-smi ${c} --json did not finish within 5000 ms and was killed (hung driver?)`,
      ]),
    );
  });

  it("amd-smi prints no JSON and rocm-smi fails too: both problems, no GPUs, no throw", async () => {
    const bad = ok("", 1, "ImportError: libamd_smi.so: cannot open shared object file");
    const report = await queryAmdGpus(
      context(
        runner({
          "amd-smi list --json": bad,
          "amd-smi static --json": bad,
          "amd-smi metric --json": bad,
          "rocm-smi --showallinfo --json": ok("WARNING: No JSON data to report\n"),
        }),
      ),
    );
    expect(report.gpus).toEqual([]);
    expect(report.problems.map((p) => [p.code, p.message])).toEqual([
      ...["list", "static", "metric"].map((c) => [
        "LLMGW_DISCOVERY_AMD_SMI_FAILED",
        `amd-smi ${c} --json printed no JSON (exit 1: ImportError: libamd_smi.so: cannot open shared object file)`,
      ]),
      ["LLMGW_DISCOVERY_ROCM_SMI_FAILED", "rocm-smi printed no JSON (exit 0)"],
    ]);
  });

  it("JSON followed by a warning and a non-zero exit still counts (§4.5)", async () => {
    const report = await queryAmdGpus(
      context(
        runner({
          ...AMD_SMI_OK,
          "amd-smi metric --json": ok(
            `${fixture("amd-smi-metric-radeon.txt")}\nWARNING: some metrics are not supported\n`,
            2,
            "warning",
          ),
        }),
      ),
    );
    expect(report.problems).toEqual([]);
    expect(report.gpus[0]?.utilizationPercent).toBe(91);
  });

  it("one amd-smi document failing keeps the others' GPUs, with a problem, no fallback", async () => {
    const r = runner({ ...AMD_SMI_OK, "amd-smi metric --json": TIMED_OUT, ...ROCM_SMI_OK });
    const report = await queryAmdGpus(context(r));
    expect(report.tool).toBe("amd-smi");
    expect(report.gpus.map((g) => [g.pciBusId, g.name, g.memoryUsedBytes])).toEqual([
      ["00000000:23:00.0", "AMD Instinct MI350X", undefined],
    ]);
    expect(report.problems.map((p) => p.code)).toEqual(["LLMGW_DISCOVERY_AMD_SMI_FAILED"]);
    expect(r.calls).not.toContain("rocm-smi --showallinfo --json");
  });

  it("amd-smi installed on a node without AMD GPUs: `[]` is an answer, not a failure", async () => {
    const r = runner({
      "amd-smi list --json": ok("[]"),
      "amd-smi static --json": ok("[]"),
      "amd-smi metric --json": ok('{"gpu_data": []}'),
    });
    expect(await queryAmdGpus(context(r))).toEqual({ gpus: [], problems: [], tool: "amd-smi" });
  });
});
