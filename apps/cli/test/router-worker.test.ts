/**
 * The shipped router worker: `llmgw control-plane` runs from the tsup bundle, whose request
 * analyzer loads `dist/router-worker.js` into its tinypool pool (the package tests load the
 * source worker through tsx instead). A large body must be analysed there, in place in shared
 * memory, exactly as inline.
 */
import path from "node:path";
import { createRequestAnalyzer, type RequestAnalyzer } from "@llmgw/router";
import { afterAll, beforeAll, expect, it } from "vitest";
import { ensureCliBuilt, repoRoot } from "./cluster-harness.js";

const workerFile = path.join(repoRoot, "apps", "cli", "dist", "router-worker.js");
const inline = createRequestAnalyzer({ pool: false });
let bundled: RequestAnalyzer;

beforeAll(() => {
  ensureCliBuilt();
  // After the build: `minThreads: 1` loads the worker file at once.
  bundled = createRequestAnalyzer({
    inlineThresholdBytes: 0,
    pool: { filename: workerFile, minThreads: 1, maxThreads: 1, execArgv: [] },
  });
});
afterAll(() => Promise.all([bundled?.close(), inline.close()]));

it("analyses large bodies in the bundled worker, in place, as inline does", async () => {
  for (const size of [20_000, 150_000]) {
    const body = new TextEncoder().encode(
      JSON.stringify({
        model: "m",
        max_tokens: 4,
        messages: [{ role: "user", content: `line one\n${"é".repeat(size)}` }],
      }),
    );
    const owned = bundled.buffers.take(body.length);
    owned.set(body);
    const viaWorker = await bundled.analyze(owned, true);
    expect(viaWorker).toMatchObject({ ok: true, mode: "pool", model: "m", maxTokens: 4 });
    expect({ ...viaWorker, mode: "inline" }).toEqual(await inline.analyze(body));
    expect(Buffer.from(owned).equals(body)).toBe(true);
    bundled.buffers.give(owned);
  }
});
