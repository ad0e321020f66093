import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { rm, rmdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { type ControlPlane, inventoryToProto, startControlPlane } from "@llmgw/control-plane";
import { FakeAgent } from "@llmgw/control-plane/testing";
import { simulateInventory } from "@llmgw/discovery";
import { ReplicaState } from "@llmgw/proto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runCli } from "../src/cli.js";

// Runs the real, built `llmgw` against a control plane started in this process (on port 0,
// temp data dir), with a fake agent that reports its replicas ready.
const run = promisify(execFile);
const cliRoot = resolve(dirname(fileURLToPath(import.meta.url)), "..");
let outDir: string;
let dataDir: string;
let cp: ControlPlane;
let agent: FakeAgent;
let beating = true;

async function llmgw(args: string[], env: Record<string, string> = {}) {
  try {
    const { stdout, stderr } = await run(process.execPath, [join(outDir, "main.js"), ...args], {
      env: {
        PATH: process.env.PATH ?? "",
        LLMGW_CONTROL_PLANE: cp.controlUrl,
        LLMGW_ADMIN_TOKEN: cp.adminToken,
        ...env,
      },
      timeout: 60_000,
    });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

beforeAll(async () => {
  outDir = join(cliRoot, "test", "dist", `cp-admin-${process.pid}`);
  await run("npx", ["tsup", "--out-dir", outDir, "--no-sourcemap"], {
    cwd: cliRoot,
    timeout: 120_000,
  });
  dataDir = mkdtempSync(join(tmpdir(), "llmgw-cli-cp-"));
  cp = await startControlPlane({
    dataDir,
    listen: "127.0.0.1:0",
    controlListen: "127.0.0.1:0",
    heartbeatIntervalMs: 200,
  });
  agent = new FakeAgent({
    controlUrl: cp.controlUrl,
    joinToken: cp.joinToken,
    inventory: inventoryToProto(
      simulateInventory("2xh100-80g", { hostname: "node-a", addresses: ["127.0.0.1"] }),
    ),
  });
  agent.defaultReport = { state: ReplicaState.READY, apiPort: 40_001 };
  await agent.register();
  void (async () => {
    while (beating) {
      await agent.heartbeat().catch(() => undefined);
      await new Promise((r) => setTimeout(r, 100));
    }
  })();
}, 180_000);

afterAll(async () => {
  beating = false;
  await cp?.close();
  if (dataDir) rmSync(dataDir, { recursive: true, force: true });
  if (outDir) {
    await rm(outDir, { recursive: true, force: true });
    await rmdir(dirname(outDir)).catch(() => undefined);
  }
});

describe("llmgw admin commands (built CLI)", () => {
  it("deploys and waits until the replica is ready", async () => {
    const r = await llmgw([
      "deploy",
      "chat",
      "--model",
      "org/m",
      "--engine",
      "vllm",
      "--gpu-class",
      "h100-80g",
      "--wait",
      "--timeout",
      "30",
    ]);
    expect(r.stderr).toContain("applied chat (revision 1)");
    expect(r.stderr).toMatch(/chat-0 {2}ready at 127\.0\.0\.1:40001/);
    expect(r.stderr).toContain("chat: 1/1 ready");
    expect(r.code).toBe(0);
  });

  it("lists deployments as JSON and as a table", async () => {
    const json = await llmgw(["deployments", "--json"]);
    expect(json.code).toBe(0);
    const parsed = JSON.parse(json.stdout) as {
      deployments: { spec: { name: string }; readyReplicas: number }[];
    };
    expect(parsed.deployments.map((d) => d.spec.name)).toEqual(["chat"]);
    const table = await llmgw(["deployments"]);
    expect(table.stdout.split("\n")[0]).toMatch(
      /^NAME\s+MODEL\s+ENGINE\s+CLASS\s+READY\s+REV\s+STATUS$/,
    );
    expect(table.stdout).toMatch(/chat\s+chat\s+vllm\s+h100-80g\s+1\/1\s+1\s+ok/);
  });

  it("reports why a deployment cannot be placed and times out", async () => {
    const r = await llmgw([
      "deploy",
      "huge",
      "--model",
      "org/m",
      "--engine",
      "vllm",
      "--gpu-class",
      "h100-80g",
      "--tp",
      "8",
      "--wait",
      "--timeout",
      "1",
    ]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("huge: cannot place every replica:");
    expect(r.stderr).toContain("huge: timed out after");
  });

  it("shows a failed replica with the engine's last log lines and exits 1", async () => {
    agent.report("broken-0", 0, {
      state: ReplicaState.FAILED,
      message: "restart limit reached",
      logTail: ["torch.OutOfMemoryError: CUDA out of memory"],
    });
    const r = await llmgw([
      "deploy",
      "broken",
      "--model",
      "org/m",
      "--engine",
      "vllm",
      "--gpu-class",
      "h100-80g",
      "--wait",
      "--timeout",
      "30",
    ]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("broken-0  failed (restart limit reached)");
    expect(r.stderr).toContain("torch.OutOfMemoryError: CUDA out of memory");
    expect(r.stderr).toContain("broken: 1 replica(s) failed");
    expect((await llmgw(["undeploy", "broken"])).stdout).toBe("deleted broken\n");
  });

  it("creates, lists and revokes API keys", async () => {
    const created = await llmgw([
      "keys",
      "create",
      "--name",
      "app",
      "--models",
      "chat",
      "--rpm",
      "60",
    ]);
    expect(created.code).toBe(0);
    const secret = created.stdout.trim();
    expect(secret).toMatch(/^sk-llmgw-[A-Za-z0-9_-]{43}$/);
    expect(cp.cluster.apiKeys.authenticate(secret)?.name).toBe("app");
    const listed = await llmgw(["keys", "list"]);
    expect(listed.stdout).toMatch(/app\s+sk-llmgw-\S+…\s+chat\s+-\s+standard\s+60\s+-\s+-/);
    expect(listed.stdout).not.toContain(secret);
    const revoked = await llmgw(["keys", "revoke", "app"]);
    expect(revoked.stdout).toMatch(/^revoked API key app \(key_[0-9a-f]+\)/);
    expect(cp.cluster.apiKeys.authenticate(secret)).toBeUndefined();
    expect((await llmgw(["keys", "list"])).stdout).not.toMatch(/\bapp\b/);
  });

  it("says clearly when the control plane is unreachable, the token is wrong or a name is unknown", async () => {
    const down = await llmgw(["nodes"], { LLMGW_CONTROL_PLANE: "http://127.0.0.1:1" });
    expect(down.code).toBe(1);
    expect(down.stderr).toContain(
      "cannot reach the control plane at http://127.0.0.1:1: ECONNREFUSED — is it running? set --control-plane",
    );
    const bad = await llmgw(["nodes"], { LLMGW_ADMIN_TOKEN: "nope" });
    expect(bad.code).toBe(1);
    expect(bad.stderr).toContain("refused the admin token: wrong token");
    const unknown = await llmgw(["undeploy", "nope"]);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toContain('no deployment named "nope"');
    const missing = await llmgw(["nodes"], { LLMGW_ADMIN_TOKEN: "" });
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain("no admin token");
  });

  it("lists nodes and cordons one by hostname", async () => {
    const nodes = await llmgw(["nodes"]);
    expect(nodes.stdout).toMatch(/node-a-\w+\s+node-a\s+ready\s+2×h100-80g\s+1\/2/);
    const cordoned = await llmgw(["cordon", "node-a"]);
    expect(cordoned.stdout).toMatch(/node-a \(node-a-\w+\): ready,cordoned/);
    await llmgw(["uncordon", "node-a"]);
    const status = await llmgw(["status"]);
    expect(status.stdout).toContain("nodes        1/1 ready");
    expect(status.stdout).toMatch(/h100-80g\s+-\s+2\s+1\s+1\s+0/);
    const replicas = await llmgw(["replicas", "--deployment", "chat"]);
    expect(replicas.stdout).toMatch(
      /chat-0\s+chat\s+ready\s+node-a-\w+\[\d\]\s+127\.0\.0\.1:40001/,
    );
  });
});

describe("llmgw control-plane (in process)", () => {
  it("runs until its signal aborts, then shuts down cleanly; token prints the join token", async () => {
    const dir = mkdtempSync(join(tmpdir(), "llmgw-cli-run-"));
    const controller = new AbortController();
    const out: string[] = [];
    const io = {
      stdout: { write: (s: string) => out.push(s) },
      stderr: { write: (s: string) => out.push(s) },
      env: {},
      cwd: dir,
      signal: controller.signal,
    };
    const running = runCli(
      [
        "control-plane",
        "--data-dir",
        dir,
        "--listen",
        "127.0.0.1:0",
        "--control-listen",
        "127.0.0.1:0",
      ],
      io,
    );
    for (let i = 0; i < 100 && !out.join("").includes(" ready "); i++)
      await new Promise((r) => setTimeout(r, 50));
    expect(out.join("")).toMatch(/ready control=http:\/\/127\.0\.0\.1:\d+/);
    expect(existsSync(join(dir, "join-token"))).toBe(true);
    controller.abort(new Error("received SIGTERM"));
    expect(await running).toBe(0);
    expect(out.join("")).toContain("stopped");
    const token: string[] = [];
    expect(
      await runCli(["control-plane", "token", "--data-dir", dir], {
        ...io,
        stdout: { write: (s: string) => token.push(s) },
      }),
    ).toBe(0);
    expect(token.join("")).toMatch(/^llmgw-join-\S+\n$/);
    rmSync(dir, { recursive: true, force: true });
  });
});
