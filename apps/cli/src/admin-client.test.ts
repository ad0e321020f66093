import { Code, ConnectError } from "@connectrpc/connect";
import { afterEach, describe, expect, it } from "vitest";
import { adminContext, describeAdminError } from "./admin-client.js";
import { UsageError } from "./command.js";
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

describe("adminContext's --control-plane", () => {
  it.each(["http://", "https://[::1", "ftp://cp:7070", "cp:7070"])(
    "refuses %j before any call, as a usage error",
    (url) => {
      // Named as it was read (a trailing slash dropped).
      const run = () => adminContext({ "control-plane": url, token: "t" }, capturedIo({}));
      expect(run).toThrow(UsageError);
      expect(run).toThrow(/^--control-plane must be an http:\/\/ or https:\/\/ URL, got "/);
    },
  );
});

describe("adminContext's warning about a token sent in clear", () => {
  it.each([
    "http://10.0.0.5:7070",
    "http://cp.example.com:7070",
    "http://[2001:db8::1]:7070",
    "https://cp-a:7070,http://cp-b:7070",
  ])("warns once on stderr for %s: the admin token would cross the network unencrypted", (url) => {
    const io = capturedIo({ LLMGW_ADMIN_TOKEN: "t" });
    adminContext({ "control-plane": url }, io);
    const plain = url.split(",").find((u) => u.startsWith("http://")) as string;
    expect(io.err()).toBe(
      `llmgw: warning: ${plain} is plain HTTP to another host: the admin token crosses the network unencrypted; serve the control plane with --tls-cert/--tls-key and use https://\n`,
    );
    expect(io.out()).toBe("");
  });

  it.each([
    "http://127.0.0.1:7070",
    "http://127.1.2.3:7070",
    "http://localhost:7070",
    "http://[::1]:7070",
    "https://cp.example.com:7070",
  ])("says nothing for %s (loopback, or TLS)", (url) => {
    const io = capturedIo({ LLMGW_ADMIN_TOKEN: "t" });
    adminContext({ "control-plane": url }, io);
    expect(io.err()).toBe("");
  });
});

describe("adminContext's warning about a token on the command line", () => {
  it("warns when --token gives it: every local user reads argv (ps, /proc)", () => {
    const io = capturedIo({});
    adminContext({ "control-plane": "http://127.0.0.1:7070", token: "t" }, io);
    expect(io.err()).toBe(
      "llmgw: warning: --token puts the admin token on the command line, where every local user can read it (ps, /proc); set LLMGW_ADMIN_TOKEN instead\n",
    );
  });

  it("says nothing when LLMGW_ADMIN_TOKEN gives it", () => {
    const io = capturedIo({ LLMGW_ADMIN_TOKEN: "t" });
    adminContext({ "control-plane": "http://127.0.0.1:7070" }, io);
    expect(io.err()).toBe("");
  });
});
