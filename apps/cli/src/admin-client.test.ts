import { Code, ConnectError } from "@connectrpc/connect";
import { afterEach, describe, expect, it } from "vitest";
import { adminContext, describeAdminError } from "./admin-client.js";
import { capturedIo, type FakeClusterService, startFakeClusterService } from "./testing.js";

let fake: FakeClusterService | undefined;
afterEach(async () => {
  await fake?.close();
  fake = undefined;
});

describe("adminContext's calls against a control plane that never answers", () => {
  const flags = () => ({ "control-plane": fake?.url, token: "t" });

  it("fail with DeadlineExceeded after the per-call timeout", async () => {
    fake = await startFakeClusterService({ listNodes: () => new Promise<never>(() => {}) });
    const ctx = adminContext(flags(), capturedIo({}), 200);
    const started = Date.now();
    const error = await ctx.client.listNodes({}).catch((e: unknown) => ConnectError.from(e));
    expect(error).toMatchObject({ code: Code.DeadlineExceeded });
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(describeAdminError(error, fake.url)).toBe(
      `the control plane at ${fake.url} did not answer in time (the operation timed out) — is it overloaded, or is the network to it dropping packets?`,
    );
  });

  it("stop at Ctrl-C (io.signal)", async () => {
    fake = await startFakeClusterService({ listNodes: () => new Promise<never>(() => {}) });
    const io = capturedIo({});
    const ctx = adminContext(flags(), io);
    setTimeout(() => io.abort.abort(new Error("received SIGINT")), 100);
    const error = await ctx.client.listNodes({}).catch((e: unknown) => ConnectError.from(e));
    expect(error).toMatchObject({ code: Code.Canceled, rawMessage: "received SIGINT" });
  });
});
