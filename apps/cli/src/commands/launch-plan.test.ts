import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { describe, expect, it } from "vitest";
import type { CliIo } from "../command.js";
import { command, inventoryFromProtoJson, placeNaively, shellQuote } from "./launch-plan.js";

const fixtures = resolve(
  dirname(fileURLToPath(import.meta.url)),
  "../../../../packages/engines/test/fixtures",
);
const load = async (name: string) =>
  inventoryFromProtoJson(
    JSON.parse(await readFile(resolve(fixtures, `inventory-${name}.json`), "utf8")),
  );

function io(): CliIo & { out: () => string; err: () => string } {
  let out = "";
  let err = "";
  return {
    stdout: { write: (c: string) => (out += c) },
    stderr: { write: (c: string) => (err += c) },
    env: {},
    cwd: fixtures,
    signal: new AbortController().signal,
    out: () => out,
    err: () => err,
  };
}

describe("inventoryFromProtoJson", () => {
  it("turns protobuf JSON (uint64 strings, omitted zero values) into discovery's plain inventory", async () => {
    const inv = await load("h100-ib-a");
    expect(inv.gpus[0]).toMatchObject({
      index: 0,
      memoryTotalBytes: 85520809984,
      computeCapability: "9.0",
      migEnabled: false,
      lost: false,
    });
    expect(inv.host.memoryBytes).toBe(2163589775360);
    expect(inv.fabrics[0]?.ports[3]).toMatchObject({
      device: "mlx5_3",
      port: 1,
      linkLayer: "infiniband",
      netdev: "ib3",
    });
    expect(inv.topology.gpuNics).toContainEqual({ gpu: 0, nic: "mlx5_0", path: "PIX" });
  });

  it("refuses JSON that is not a NodeInventory", () => {
    expect(() => inventoryFromProtoJson({ hostname: "x", gpuz: [] })).toThrow(/gpuz/);
  });
});

describe("placeNaively", () => {
  it("takes healthy GPUs first and the fabric every node shares", async () => {
    const a = await load("h100-ib-a");
    const b = await load("h100-ib-b");
    const sick = { ...b, gpus: b.gpus.map((g) => (g.index === 0 ? { ...g, healthy: false } : g)) };
    const d = parseDeploymentSpecOrThrow({
      name: "m",
      model: "m",
      engine: "vllm",
      tensorParallel: 4,
      pipelineParallel: 2,
    });
    expect(placeNaively(d, [a, sick])).toEqual([
      { nodeId: "gpu-a", gpuIndices: [0, 1, 2, 3], fabricId: a.fabrics[0]?.id },
      { nodeId: "gpu-b", gpuIndices: [1, 2, 3, 4], fabricId: a.fabrics[0]?.id },
    ]);
  });

  it("single node: no fabric; CPU llama.cpp: no GPUs", async () => {
    const cpu = await load("cpu");
    const d = parseDeploymentSpecOrThrow({ name: "t", model: "/t.gguf", engine: "llamacpp" });
    expect(placeNaively(d, [cpu])).toEqual([{ nodeId: "cpu-a", gpuIndices: [] }]);
  });
});

describe("shellQuote", () => {
  it.each([
    ["vllm", "vllm"],
    ["=mlx5_0:1,mlx5_3:1", "=mlx5_0:1,mlx5_3:1"],
    ["", "''"],
    ["a b", "'a b'"],
    ["it's", "'it'\\''s'"],
    ["$(id)", "'$(id)'"],
  ])("%j → %s", (word, quoted) => {
    expect(shellQuote(word)).toBe(quoted);
  });
});

describe("launch-plan command (in process)", () => {
  it("prints the spec issues as JSON and exits 1", async () => {
    const t = io();
    const code = await command.run(
      ["-f", "inventory-cpu.json", "--inventory", "inventory-cpu.json", "--json"],
      t,
    );
    expect(code).toBe(1);
    const out = JSON.parse(t.out()) as { ok: boolean; specIssues: { field: string }[] };
    expect(out.ok).toBe(false);
    expect(out.specIssues.map((i) => i.field)).toContain("name");
  });

  it("names the inventory it cannot read", async () => {
    const dir = await mkdtemp(join(tmpdir(), "llmgw-lp-"));
    try {
      await writeFile(join(dir, "spec.yaml"), "name: m\nmodel: org/m\nengine: vllm\n");
      const t = { ...io(), cwd: dir };
      const code = await command.run(["-f", "spec.yaml", "--inventory", "missing.json"], t);
      expect(code).toBe(1);
      expect(t.err()).toContain("llmgw launch-plan: cannot read inventory missing.json: ENOENT");
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
