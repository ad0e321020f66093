import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ControlPlane, startControlPlane } from "@llmgw/control-plane";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runCli } from "../src/cli.js";

// `llmgw tenants …` and `llmgw keys …` with tenants, run in-process against a real control
// plane on loopback (port 0, temp data dir).
let dataDir: string;
let cp: ControlPlane;

beforeAll(async () => {
  dataDir = mkdtempSync(join(tmpdir(), "llmgw-cli-tenants-"));
  cp = await startControlPlane({
    dataDir,
    listen: "127.0.0.1:0",
    controlListen: "127.0.0.1:0",
  });
});
afterAll(async () => {
  await cp?.close();
  if (dataDir) rmSync(dataDir, { recursive: true, force: true });
});

/** Runs `llmgw ARGS`: its exit code, stdout and stderr. */
async function llmgw(args: string[]) {
  let stdout = "";
  let stderr = "";
  const code = await runCli(args, {
    stdout: { write: (s: string) => (stdout += s) },
    stderr: { write: (s: string) => (stderr += s) },
    env: { LLMGW_CONTROL_PLANE: cp.controlUrl, LLMGW_ADMIN_TOKEN: cp.adminToken },
    cwd: process.cwd(),
    signal: new AbortController().signal,
  });
  return { code, stdout, stderr };
}

/** The rows of a table, cells split on runs of two or more spaces. */
const rows = (table: string) =>
  table
    .trimEnd()
    .split("\n")
    .map((line) => line.trim().split(/\s{2,}/));

describe("llmgw tenants", () => {
  it("creates, lists, updates and deletes a tenant that owns keys", async () => {
    const created = await llmgw([
      "tenants",
      "create",
      "search",
      "--tpm",
      "100000",
      "--budget",
      "day=1000000",
      "--budget",
      "month:llama-3-8b=50000000",
      "--priority",
      "critical",
      "--weight",
      "4",
      "--cache-isolation",
      "tenant",
    ]);
    expect(created).toEqual({ code: 0, stdout: "created tenant search\n", stderr: "" });

    const key = await llmgw([
      "keys",
      "create",
      "--name",
      "search-app",
      "--tenant",
      "search",
      "--priority",
      "batch",
      "--budget",
      "day:chat=5000",
    ]);
    expect(key.code).toBe(0);
    expect(cp.cluster.apiKeys.authenticate(key.stdout.trim())?.name).toBe("search-app");
    expect(cp.cluster.apiKeys.list()[0]).toMatchObject({
      tenant: "search",
      priority: "batch",
      budgets: [{ period: "day", model: "chat", tokens: 5000 }],
    });
    expect((await llmgw(["keys", "create", "--name", "plain"])).code).toBe(0);

    const keys = rows((await llmgw(["keys", "list"])).stdout);
    expect(keys[0]).toEqual([
      "ID",
      "NAME",
      "PREFIX",
      "MODELS",
      "TENANT",
      "PRIORITY",
      "RPM",
      "TPM",
      "CONCURRENCY",
      "CREATED",
      "REVOKED",
    ]);
    expect(keys.slice(1).map((r) => r.slice(1, 2).concat(r.slice(4, 6)))).toEqual([
      ["search-app", "search", "batch"],
      ["plain", "-", "standard"],
    ]);

    expect(rows((await llmgw(["tenants", "list"])).stdout)).toEqual([
      ["NAME", "RPM", "TPM", "CONCURRENCY", "BUDGETS", "PRIORITY", "WEIGHT", "ISOLATION", "KEYS"],
      [
        "search",
        "-",
        "100000",
        "-",
        "day=1000000,month:llama-3-8b=50000000",
        "critical",
        "4",
        "tenant",
        "1",
      ],
    ]);

    const updated = await llmgw([
      "tenants",
      "update",
      "search",
      "--rpm",
      "60",
      "--clear-tpm",
      "--budget",
      "month=7",
      "--clear-priority",
      "--cache-isolation",
      "key",
    ]);
    expect(updated).toEqual({
      code: 0,
      stdout:
        "updated tenant search (requests_per_minute, tokens_per_minute, budgets, priority, cache_isolation)\n",
      stderr: "",
    });
    const json = JSON.parse((await llmgw(["tenants", "list", "--json"])).stdout);
    expect(json).toEqual({
      tenants: [
        {
          name: "search",
          requestsPerMinute: 60,
          budgets: [{ period: "BUDGET_PERIOD_MONTH", tokens: "7" }],
          weight: 4,
          cacheIsolation: "key",
          createdAtUnixMs: expect.any(String),
          updatedAtUnixMs: expect.any(String),
          activeKeys: 1,
        },
      ],
    });

    // Back to each router's own isolation.
    expect((await llmgw(["tenants", "update", "search", "--clear-cache-isolation"])).stdout).toBe(
      "updated tenant search (cache_isolation)\n",
    );
    expect(rows((await llmgw(["tenants", "list"])).stdout)[1]?.[7]).toBe("-");

    const refused = await llmgw(["tenants", "delete", "search"]);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain(
      "tenant search has 1 active API key; revoke it first (llmgw keys list, llmgw keys revoke)",
    );
    expect((await llmgw(["keys", "revoke", "search-app"])).code).toBe(0);
    expect(await llmgw(["tenants", "delete", "search"])).toEqual({
      code: 0,
      stdout: "deleted tenant search\n",
      stderr: "",
    });
    expect(rows((await llmgw(["tenants", "list"])).stdout)).toEqual([
      ["NAME", "RPM", "TPM", "CONCURRENCY", "BUDGETS", "PRIORITY", "WEIGHT", "ISOLATION", "KEYS"],
    ]);
  });

  it("refuses bad flags before calling, and says what the control plane refused", async () => {
    const badBudget = await llmgw(["tenants", "create", "x", "--budget", "week=5"]);
    expect(badBudget.code).toBe(2);
    expect(badBudget.stderr).toContain(
      '--budget must look like day=TOKENS or month:MODEL=TOKENS (the period is day or month), got "week=5"',
    );
    const nothing = await llmgw(["tenants", "update", "x"]);
    expect(nothing.code).toBe(2);
    expect(nothing.stderr).toContain("nothing to change");
    const both = await llmgw(["tenants", "update", "x", "--rpm", "5", "--clear-rpm"]);
    expect(both.code).toBe(2);
    expect(both.stderr).toContain("--rpm and --clear-rpm contradict each other");
    const badIsolation = await llmgw(["tenants", "create", "x", "--cache-isolation", "none"]);
    expect(badIsolation.code).toBe(2);
    expect(badIsolation.stderr).toContain('--cache-isolation must be tenant or key, got "none"');

    const badName = await llmgw(["tenants", "create", "Search"]);
    expect(badName.code).toBe(1);
    expect(badName.stderr).toContain(
      `tenant name must be 1–63 lower-case letters, digits or '-' (got "Search")`,
    );
    const twice = await llmgw([
      "tenants",
      "create",
      "dup",
      "--budget",
      "day=5",
      "--budget",
      "day=6",
    ]);
    expect(twice.code).toBe(1);
    expect(twice.stderr).toContain("tenant dup has two day budgets for all models; keep one");
    const orphan = await llmgw(["keys", "create", "--name", "orphan", "--tenant", "nobody"]);
    expect(orphan.code).toBe(1);
    expect(orphan.stderr).toContain(
      `API key orphan: no tenant named "nobody"; create it first (llmgw tenants create)`,
    );
    const unknown = await llmgw(["tenants", "update", "nobody", "--weight", "2"]);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toContain('no tenant named "nobody"');
  });
});
