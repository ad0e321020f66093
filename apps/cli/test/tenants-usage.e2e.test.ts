/**
 * Tenants, usage and budgets end to end: a real control plane, two agents running simulated
 * engines, two real `llmgw router` processes, the official `openai` client. A tenant's key is
 * used through both routers; what `llmgw usage` reports equals what the engines said they
 * used, counted once across a router restart; a day budget spent through one router stops
 * the tenant at both, with `x-llmgw-limit: tenant-budget`, while another tenant goes on.
 */
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  allReady,
  deployment,
  type RoutersCluster,
  runLlmgw,
  simDeployment,
  startRoutersCluster,
  stopAll,
  tempRoot,
  waitFor,
} from "./cluster-harness.js";

const MODEL = "chat";
const root = tempRoot("llmgw-tenants-e2e-");
let c: RoutersCluster;
let teamKey = "";
let otherKey = "";
/** Tokens the engines reported for the team's requests, as the client saw them. */
const seen = { requests: 0, prompt: 0, completion: 0 };

/** `llmgw usage --json` for one tenant, summed over its rows. */
async function usageOf(tenant: string) {
  const proc = runLlmgw(["usage", "--tenant", tenant, "--since", "1d", "--json"], {
    LLMGW_CONTROL_PLANE: c.cp.controlUrl,
    LLMGW_ADMIN_TOKEN: c.cp.token("admin"),
  });
  const code = await proc.exited;
  if (code !== 0) throw new Error(`llmgw usage exited ${code}: ${proc.output()}`);
  const rows = (JSON.parse(proc.output()).rows ?? []) as Record<string, string | undefined>[];
  const sum = (field: string) => rows.reduce((s, r) => s + Number(r[field] ?? 0), 0);
  return {
    requests: sum("requests"),
    prompt: sum("promptTokens"),
    completion: sum("completionTokens"),
    estimated: sum("estimatedRequests"),
    refused: sum("refusedUsage"),
  };
}

beforeAll(async () => {
  c = await startRoutersCluster(root);
  const admin = c.cp.admin();
  const auth = c.cp.adminHeaders();
  await admin.applyDeployment(
    { deployment: simDeployment(MODEL, { gpuClass: "h100-80g", replicas: 2 }) },
    auth,
  );
  await waitFor(
    "both replicas ready",
    async () => allReady(await deployment(c.cp, MODEL), 2),
    60_000,
  );
  const tenants = runLlmgw(
    ["tenants", "create", "team-a", "--budget", "day=200000", "--priority", "critical"],
    { LLMGW_CONTROL_PLANE: c.cp.controlUrl, LLMGW_ADMIN_TOKEN: c.cp.token("admin") },
  );
  expect(await tenants.exited, tenants.output()).toBe(0);
  teamKey = (await admin.createApiKey({ name: "team-a-app", tenant: "team-a" }, auth)).secret;
  otherKey = (await admin.createApiKey({ name: "elsewhere" }, auth)).secret;
  await Promise.all(c.routers.map((r) => r.waitReady()));
}, 180_000);

afterAll(async () => {
  await stopAll([root]);
});

describe("tenants and usage across two routers", () => {
  it("counts what the engines used, through both routers, once across a router restart", async () => {
    for (const [i, router] of c.routers.entries()) {
      const client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: teamKey, maxRetries: 0 });
      for (let n = 0; n < 3; n++) {
        const content = `router ${i} question ${n}: what is a fenced leader?`;
        const plain = await client.chat.completions.create({
          model: MODEL,
          messages: [{ role: "user", content }],
          max_tokens: 20,
        });
        seen.requests += 1;
        seen.prompt += plain.usage?.prompt_tokens ?? Number.NaN;
        seen.completion += plain.usage?.completion_tokens ?? Number.NaN;
        const stream = await client.chat.completions.create({
          model: MODEL,
          messages: [{ role: "user", content: `${content} (streamed)` }],
          max_tokens: 20,
          stream: true,
          stream_options: { include_usage: true },
        });
        for await (const chunk of stream) {
          if (!chunk.usage) continue;
          seen.requests += 1;
          seen.prompt += chunk.usage.prompt_tokens;
          seen.completion += chunk.usage.completion_tokens;
        }
      }
    }
    // Router 1 stops gracefully (it seals and sends what it holds) and starts again.
    await c.routers[0]?.stop();
    await c.routers[0]?.start();
    const stored = await waitFor(
      "every request in llmgw usage",
      async () => {
        const u = await usageOf("team-a");
        return u.requests >= seen.requests ? u : undefined;
      },
      30_000,
      500,
    );
    expect(stored).toEqual({ ...seen, estimated: 0, refused: 0 });
  });

  it("stops a tenant whose day budget is spent at every router, and no other tenant", async () => {
    // A budget the usage so far nearly fills: the next requests spend it.
    const spent = seen.prompt + seen.completion;
    const update = runLlmgw(["tenants", "update", "team-a", "--budget", `day=${spent + 60}`], {
      LLMGW_CONTROL_PLANE: c.cp.controlUrl,
      LLMGW_ADMIN_TOKEN: c.cp.token("admin"),
    });
    expect(await update.exited, update.output()).toBe(0);
    const [first, second] = c.routers;
    const ask = (url: string, key: string) =>
      fetch(`${url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: JSON.stringify({
          model: MODEL,
          messages: [{ role: "user", content: "one more, please" }],
          max_tokens: 40,
        }),
      });
    // Spend it through the first router until it refuses.
    const refusal = await waitFor(
      "router 1 to refuse the tenant",
      async () => {
        const res = await ask(first?.url ?? "", teamKey);
        await res.text();
        return res.status === 429 ? res : undefined;
      },
      60_000,
      300,
    );
    expect(refusal.headers.get("x-llmgw-limit")).toBe("tenant-budget");
    expect(Number(refusal.headers.get("retry-after"))).toBeGreaterThan(0);
    // The other router learns the cluster-wide standing from its next usage report.
    const elsewhere = await waitFor(
      "router 2 to refuse the tenant too",
      async () => {
        const res = await ask(second?.url ?? "", teamKey);
        await res.text();
        return res.status === 429 ? res : undefined;
      },
      30_000,
      500,
    );
    expect(elsewhere.headers.get("x-llmgw-limit")).toBe("tenant-budget");
    // Another tenant's key is untouched.
    const other = await ask(second?.url ?? "", otherKey);
    expect(other.status).toBe(200);
    await other.text();
  });
});
