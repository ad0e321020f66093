import { setImmediate as yieldToIo } from "node:timers/promises";
import { describe, expect, it } from "vitest";
import { type EngineSimClock, startEngineSim } from "../src/index.js";

/** Time that advances only when the engine sleeps: the sim runs as fast as the CPU allows. */
function virtualClock(): EngineSimClock & { elapsedMs(): number } {
  let t = 0;
  return {
    now: () => t,
    elapsedMs: () => t,
    async sleep(ms) {
      t += Math.max(0, ms);
      await yieldToIo();
    },
  };
}

function sample(text: string, name: string): number {
  return Number(new RegExp(`^${name}\\{[^}]*\\} (\\S+)$`, "m").exec(text)?.[1]);
}

describe("the engine loop on an injected clock", () => {
  it("reports TTFT and ITL in model time, exactly as the timing model predicts", async () => {
    const clock = virtualClock();
    const sim = await startEngineSim(
      {
        model: "m",
        port: 0,
        timing: { prefillTokensPerSecond: 1000, decodeStepMs: 20, decodeStepMsPerSeq: 0 },
      },
      { clock },
    );
    try {
      const prompt = "p".repeat(400); // 100 tokens: 100 ms of prefill at 1000 tok/s
      const res = await fetch(`${sim.url}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ model: "m", prompt, max_tokens: 50, ignore_eos: true }),
      });
      expect(
        ((await res.json()) as { usage: { completion_tokens: number } }).usage.completion_tokens,
      ).toBe(50);
      const metrics = await (await fetch(`${sim.url}/metrics`)).text();
      expect(sample(metrics, "vllm:time_to_first_token_seconds_sum")).toBeCloseTo(0.02 + 0.1, 9);
      expect(sample(metrics, "vllm:inter_token_latency_seconds_count")).toBe(49);
      expect(sample(metrics, "vllm:inter_token_latency_seconds_sum")).toBeCloseTo(49 * 0.02, 9);
      expect(clock.elapsedMs()).toBeCloseTo(120 + 49 * 20, 6);
    } finally {
      await sim.close();
    }
  });
});
