/**
 * Every metric a Grafana dashboard or Prometheus rule queries exists in a LIVE scrape of a
 * running control plane: real router traffic to a real simulated engine, a node with GPU
 * readings, a ready replica. The metrics package checks the same against a fake view; this
 * catches what only wiring can break (a collector not registered, a family renamed in one
 * place).
 */
import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { create } from "@bufbuild/protobuf";
import { simulateInventory } from "@llmgw/discovery";
import { type RunningEngineSim, startEngineSim } from "@llmgw/engine-sim";
import {
  familyNamesInExposition,
  metricNamesInPromQL,
  promQLInDashboard,
} from "@llmgw/metrics-collector/testing";
import {
  DeploymentSchema,
  Engine,
  EngineLoadSchema,
  GpuReadingSchema,
  ReplicaState,
} from "@llmgw/proto";
import { inventoryToProto } from "@llmgw/wire";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ControlPlane } from "../src/run.js";
import { FakeAgent } from "../src/testing/fake-agent.js";
import { adminClient, startTestControlPlane, tempDir } from "./helpers.js";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const dashboardsDir = path.join(repo, "deploy", "grafana", "dashboards");

let cp: ControlPlane;
let sim: RunningEngineSim;
let scrape = "";
const data = tempDir("llmgw-dash-");

beforeAll(async () => {
  sim = await startEngineSim({ model: "sim/m", servedModelName: "chat", port: 0, timeScale: 50 });
  cp = await startTestControlPlane(data.dir);
  const inventory = simulateInventory("2xh100-80g@ib-a", { hostname: "dash-node" });
  const agent = new FakeAgent({
    controlUrl: cp.controlUrl,
    joinToken: cp.joinToken,
    inventory: inventoryToProto(inventory),
  });
  agent.gpus = inventory.gpus.map((g) =>
    create(GpuReadingSchema, {
      index: g.index,
      uuid: g.uuid,
      healthy: true,
      memoryUsedBytes: 20n * 1024n ** 3n,
      utilizationPercent: 63,
      eccUncorrectedErrors: 0n,
      temperatureCelsius: 51,
      powerWatts: 410,
    }),
  );
  await agent.register();
  const admin = adminClient(cp, cp.adminToken);
  await admin.applyDeployment({
    deployment: create(DeploymentSchema, {
      name: "chat",
      model: "sim/m",
      engine: Engine.SIM,
      gpuClass: "h100-80g",
      replicas: 1,
    }),
  });
  await agent.heartbeat();
  const [assignment] = agent.assignments;
  if (!assignment) throw new Error("no assignment");
  agent.report(assignment.replicaId, 0, {
    state: ReplicaState.READY,
    pid: process.pid,
    apiPort: sim.port,
    load: create(EngineLoadSchema, {
      running: 0,
      waiting: 0,
      kvCacheUsage: 0.1,
      prefixCacheHitRate: 0.5,
    }),
  });
  await agent.heartbeat();
  const { secret } = await admin.createApiKey({ name: "dash" });
  const call = (body: unknown, key = secret) =>
    fetch(`${cp.publicUrl}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(body),
    }).then((r) => r.text());
  const messages = [{ role: "user", content: "hello dashboards" }];
  await call({ model: "chat", messages, max_tokens: 4 });
  await call({ model: "chat", messages, max_tokens: 4, stream: true });
  await call({ model: "nope", messages });
  await call({ model: "chat", messages }, "sk-llmgw-wrong");
  scrape = await (await fetch(`${cp.controlUrl}/metrics`)).text();
}, 60_000);

afterAll(async () => {
  await cp?.close();
  await sim?.close();
  data.cleanup();
});

describe("dashboards against a live control plane", () => {
  const dashboards = readdirSync(dashboardsDir).filter((f) => f.endsWith(".json"));

  it("has dashboards to check", () => {
    expect(dashboards.length).toBeGreaterThanOrEqual(3);
  });

  it.each(dashboards)("every metric %s queries is in the live scrape", (file) => {
    const families = familyNamesInExposition(scrape);
    const declared = new Set([...scrape.matchAll(/^# TYPE (\S+) /gm)].map((m) => m[1] as string));
    const dashboard = JSON.parse(readFileSync(path.join(dashboardsDir, file), "utf8"));
    const missing: string[] = [];
    for (const expr of promQLInDashboard(dashboard)) {
      for (const name of metricNamesInPromQL(expr)) {
        const base = name.replace(/_(bucket|sum|count)$/, "");
        if (!families.has(name) && !declared.has(name) && !declared.has(base)) {
          missing.push(`${name} (in ${expr})`);
        }
      }
    }
    expect(missing).toEqual([]);
  });

  it("carries real values: router traffic and GPU readings, absent ones absent", () => {
    expect(scrape).toMatch(/^llmgw_router_requests_total\{[^}]*model="chat"[^}]*\} [1-9]/m);
    expect(scrape).toMatch(/^llmgw_gpu_temperature_celsius\{[^}]*\} 51$/m);
    // Power was reported, fan speed is not a family at all; nothing unreported shows as 0.
    expect(scrape).not.toMatch(/^llmgw_gpu_utilization_ratio\{[^}]*\} 0$/m);
  });
});
