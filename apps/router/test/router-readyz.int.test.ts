/**
 * `/readyz` of `llmgw router` on its two listeners, over a real WatchRouting stream from a
 * scripted control plane on loopback: the public listener (anyone who reaches the API) says
 * only whether to send traffic and how old the state is; the metrics listener also names the
 * control plane, the epoch, the version and the stream.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { ConnectRouter, HandlerContext } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { RouterService } from "@llmgw/proto";
import { routingMessageToProto } from "@llmgw/wire";
import { afterEach, describe, expect, it } from "vitest";
import { parseRouterConfig, type RouterDaemon, startRouterDaemon } from "../src/index.js";
import { waitFor } from "./router-fake-engine.js";
import { routingSnapshot } from "./routing-fixture.js";

const ROUTER_TOKEN = "rt-readyz-secret";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A control plane whose WatchRouting sends a snapshot once `release` is called, then holds. */
async function scriptedControlPlane() {
  let release!: () => void;
  let watching = 0;
  const released = new Promise<void>((resolve) => {
    release = resolve;
  });
  const routes = (router: ConnectRouter) =>
    router.service(RouterService, {
      async *watchRouting(_req, ctx: HandlerContext) {
        watching += 1;
        await Promise.race([
          released,
          new Promise((resolve) => ctx.signal.addEventListener("abort", resolve)),
        ]);
        if (ctx.signal.aborted) return;
        yield routingMessageToProto(
          routingSnapshot({
            epoch: "epoch-readyz",
            version: 4,
            models: { m: { replicas: [{ id: "m-0", baseUrl: "http://127.0.0.1:9" }] } },
          }),
        );
        await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
      },
    });
  const server: Server = createServer(connectNodeAdapter({ routes }));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  cleanups.push(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  );
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return { url, release, watching: () => watching };
}

async function daemon(controlPlane: string): Promise<RouterDaemon & { metricsUrl: string }> {
  const dir = mkdtempSync(join(tmpdir(), "llmgw-router-readyz-"));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  const tokenFile = join(dir, "router-token");
  writeFileSync(tokenFile, `${ROUTER_TOKEN}\n`, { mode: 0o600 });
  const config = parseRouterConfig({
    "control-plane": [controlPlane],
    "router-token-file": tokenFile,
    "state-dir": join(dir, "state"),
    listen: "127.0.0.1:0",
    "metrics-listen": "127.0.0.1:0",
    address: "127.0.0.1:8080",
  });
  const d = await startRouterDaemon(config, { version: "0.0.0-test" });
  cleanups.push(async () => {
    await d.close();
  });
  if (d.metricsUrl === undefined) throw new Error("no metrics listener");
  return d as RouterDaemon & { metricsUrl: string };
}

const readyz = async (base: string) => {
  const res = await fetch(`${base}/readyz`);
  const text = await res.text();
  return { status: res.status, text, body: JSON.parse(text) as Record<string, unknown> };
};

describe("/readyz", () => {
  it("tells the public listener only status, source, age and connection; the metrics listener the rest", async () => {
    const cp = await scriptedControlPlane();
    const d = await daemon(cp.url);
    const publicUrl = d.router.url;

    // Before a snapshot: 503 on both, the reason and the stream only on the metrics listener.
    await waitFor(() => cp.watching() > 0, 5000, "the router's WatchRouting");
    expect(await readyz(publicUrl)).toMatchObject({
      status: 503,
      body: { status: "not_ready", ready: false, source: "none" },
    });
    expect(Object.keys((await readyz(publicUrl)).body).sort()).toEqual([
      "connected",
      "ready",
      "source",
      "status",
    ]);
    expect(await readyz(d.metricsUrl)).toMatchObject({
      status: 503,
      body: {
        status: "not_ready",
        ready: false,
        source: "none",
        version: 0,
        connected: false,
        reason: "no routing state yet: waiting for a snapshot from a control plane",
      },
    });

    cp.release();
    await waitFor(
      () => d.router.runtime.readiness().connected,
      5000,
      "the stream to deliver its snapshot",
    );
    const pub = await readyz(publicUrl);
    expect(pub).toMatchObject({
      status: 200,
      body: {
        status: "ready",
        ready: true,
        source: "live",
        stateAgeMs: expect.any(Number),
        connected: true,
      },
    });
    expect(Object.keys(pub.body).sort()).toEqual([
      "connected",
      "ready",
      "source",
      "stateAgeMs",
      "status",
    ]);
    // Nothing internal: not the control plane's address, the epoch or the version.
    expect(pub.text).not.toContain(cp.url);
    expect(pub.text).not.toContain("127.0.0.1");
    expect(pub.text).not.toContain("epoch-readyz");

    const full = await readyz(d.metricsUrl);
    expect(full).toEqual({
      status: 200,
      text: expect.any(String),
      body: {
        status: "ready",
        ready: true,
        source: "live",
        stateAgeMs: expect.any(Number),
        epoch: "epoch-readyz",
        version: 4,
        connected: true,
        controlPlane: cp.url,
      },
    });
    expect(full.text).not.toContain(ROUTER_TOKEN);
  });
});
