import { describe, expect, it } from "vitest";
import { lastJson, runQuick } from "../lib/smoke.js";

describe("bench/router/run.ts --quick", () => {
  it("completes against every available target and prints the table", async () => {
    const { code, stdout, stderr } = await runQuick(new URL("./run.ts", import.meta.url), 240_000);
    expect(code, stderr.slice(-2000)).toBe(0);
    expect(stdout).toMatch(/workload\s+c\s+target\s+req\/s/);
    const result = lastJson<{ rows: { target: string; runs: number }[]; skipped: string[] }>(
      stdout,
    );
    // nginx may be missing locally (skipped with a reason); direct and llmgw always run.
    const targets = new Set(result.rows.map((r) => r.target));
    expect(targets.has("direct") && targets.has("llmgw")).toBe(true);
    expect(targets.has("nginx") || result.skipped.some((s) => s.startsWith("nginx"))).toBe(true);
  }, 300_000);

  it("refuses an unknown --only workload, --upstream or --targets before starting anything", async () => {
    const script = new URL("./run.ts", import.meta.url);
    const [only, upstream, limits, targets] = await Promise.all([
      runQuick(script, 60_000, ["--only", "chat,nope"]),
      runQuick(script, 60_000, ["--upstream", "nginx"]),
      runQuick(script, 60_000, ["--limits-workloads", "chat-paced,nope"]),
      runQuick(script, 60_000, ["--targets", "llmgw,haproxy"]),
    ]);
    expect(only.code).not.toBe(0);
    expect(only.stderr).toContain("--only: no such workload nope");
    expect(upstream.code).not.toBe(0);
    expect(upstream.stderr).toContain("--upstream nginx: expected sim or trivial");
    expect(limits.code).not.toBe(0);
    expect(limits.stderr).toContain("--limits-workloads: no such workload nope");
    expect(targets.code).not.toBe(0);
    expect(targets.stderr).toContain("--targets: no such target haproxy");
  }, 90_000);
});
