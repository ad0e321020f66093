/**
 * The production listeners (`startControlPlane`, which builds them with `createHttpListener`)
 * against hostile clients on loopback: slow heads and trickled bodies get their 408 within a
 * second of the documented deadline, and a connection flood is cut off at the caps while the
 * control listener still answers.
 */
import { connect, type Socket } from "node:net";
import { networkInterfaces } from "node:os";
import { afterEach, describe, expect, it } from "vitest";
import type { ControlPlaneOptions } from "../src/config.js";
import { type ControlPlane, startControlPlane } from "../src/run.js";
import { hasOpenssl, selfSignedCert } from "../src/testing/self-signed.js";
import { tempDir } from "./helpers.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

/** Whether this host has IPv6 loopback (`::1`): some containers have IPv4 only. */
const hasIpv6Loopback = Object.values(networkInterfaces()).some((list) =>
  list?.some((i) => i.address === "::1"),
);

/** A control plane with its in-process router (the public listener) on port 0. */
async function controlPlane(
  options: Partial<ControlPlaneOptions>,
): Promise<ControlPlane & { readonly publicUrl: string }> {
  const tmp = tempDir();
  cleanups.push(tmp.cleanup);
  const cp = await startControlPlane({
    dataDir: tmp.dir,
    listen: "127.0.0.1:0",
    controlListen: "127.0.0.1:0",
    shutdownGraceMs: 0,
    noAuth: true,
    ...options,
  });
  cleanups.push(() => cp.close().then(() => {}));
  if (cp.publicUrl === undefined) throw new Error("the control plane started no public listener");
  return cp as ControlPlane & { readonly publicUrl: string };
}

/** A raw connection that records what it receives and when the server closed it. */
interface Probe {
  readonly socket: Socket;
  /** Resolves once connected. */
  readonly connected: Promise<void>;
  /** Resolves when the socket closes: after how long, and what arrived before. */
  readonly closed: Promise<{ readonly afterMs: number; readonly received: string }>;
}

function probe(url: string, localAddress = "127.0.0.1"): Probe {
  const { hostname, port } = new URL(url);
  const host = hostname.replace(/^\[(.*)\]$/, "$1");
  const socket = connect({ host, port: Number(port), localAddress });
  const openedAt = performance.now();
  let received = "";
  socket.on("data", (chunk: Buffer) => {
    received += chunk.toString("latin1");
  });
  socket.on("error", () => {}); // a reset is one way of being closed
  cleanups.push(() => {
    socket.destroy();
  });
  return {
    socket,
    connected: new Promise((resolve) => socket.once("connect", () => resolve())),
    closed: new Promise((resolve) =>
      socket.once("close", () => resolve({ afterMs: performance.now() - openedAt, received })),
    ),
  };
}

/** Sends `GET /healthz` on an open probe and resolves with the first chunk of the answer. */
function healthzOver(p: Probe): Promise<string> {
  return new Promise((resolve) => {
    p.socket.once("data", (chunk: Buffer) => resolve(chunk.toString("latin1")));
    p.socket.write("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  });
}

/** `GET /healthz` on fresh connections until one is let in (at most 5 s); its answer. */
async function healthzFromNewConnection(url: string): Promise<string> {
  const deadline = performance.now() + 5_000;
  for (;;) {
    const p = probe(url);
    await p.connected;
    const answer = await Promise.race([healthzOver(p), p.closed.then(() => undefined)]);
    if (answer !== undefined) return answer;
    if (performance.now() > deadline) throw new Error(`no connection to ${url} was let in`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe("listener limits against slow clients", () => {
  const headersTimeoutMs = 1_500;
  const requestTimeoutMs = 2_500;

  it("answers a partial head with 408 within a second of the head deadline", async () => {
    const cp = await controlPlane({ headersTimeoutMs, requestTimeoutMs });
    for (const url of [cp.publicUrl, cp.controlUrl]) {
      const p = probe(url);
      await p.connected;
      p.socket.write("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl");
      const { afterMs, received } = await p.closed;
      expect(received).toMatch(/^HTTP\/1\.1 408 /);
      expect(afterMs).toBeGreaterThanOrEqual(headersTimeoutMs - 50);
      expect(afterMs).toBeLessThanOrEqual(headersTimeoutMs + 1_000);
    }
  });

  it("answers a trickled body with 408 within a second of the request deadline", async () => {
    const cp = await controlPlane({ headersTimeoutMs, requestTimeoutMs });
    const p = probe(cp.publicUrl);
    await p.connected;
    p.socket.write(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
    );
    // One byte every 100 ms: never idle long, never done in time.
    const trickle = setInterval(() => p.socket.write(" "), 100);
    cleanups.push(() => clearInterval(trickle));
    const { afterMs, received } = await p.closed;
    clearInterval(trickle);
    expect(received).toMatch(/^HTTP\/1\.1 408 /);
    expect(afterMs).toBeGreaterThanOrEqual(requestTimeoutMs - 50);
    expect(afterMs).toBeLessThanOrEqual(requestTimeoutMs + 1_000);
  });

  it.skipIf(!hasOpenssl())(
    "closes a TLS connection whose handshake never ends within a second of the head deadline",
    async () => {
      const tmp = tempDir();
      cleanups.push(tmp.cleanup);
      const { cert, key } = selfSignedCert(tmp.dir);
      const cp = await controlPlane({
        headersTimeoutMs,
        requestTimeoutMs,
        tlsCertFile: cert,
        tlsKeyFile: key,
      });
      // HTTP's deadlines start once the handshake is done; until then only TLS's own limit
      // (Node's default: 120 s) held a client that sends nothing, or half a ClientHello.
      for (const send of [undefined, Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00])]) {
        for (const url of [cp.publicUrl, cp.controlUrl]) {
          const p = probe(url.replace("https:", "http:"));
          await p.connected;
          if (send !== undefined) p.socket.write(send);
          const { afterMs } = await p.closed;
          expect(afterMs).toBeLessThanOrEqual(headersTimeoutMs + 1_000);
        }
      }
    },
  );
});

describe("listener limits against a connection flood", () => {
  it("closes connections over the per-address and listener caps; control stays reachable", async () => {
    const cp = await controlPlane({ maxConnections: 4, maxConnectionsPerAddress: 3 });
    const first = [probe(cp.publicUrl), probe(cp.publicUrl), probe(cp.publicUrl)];
    await Promise.all(first.map((p) => p.connected));
    // A fourth from the same address is closed at once, without a byte.
    const overAddress = probe(cp.publicUrl);
    expect(await overAddress.closed).toMatchObject({ received: "" });
    // Another address still gets in, up to the listener's cap of 4 …
    const other = probe(cp.publicUrl, "127.0.0.2");
    await other.connected;
    expect(await healthzOver(other)).toMatch(/^HTTP\/1\.1 200 /);
    // … and the fifth connection, whatever its address, is closed.
    const overListener = probe(cp.publicUrl, "127.0.0.3");
    expect(await overListener.closed).toMatchObject({ received: "" });
    // The connections within the caps still work, and the control listener answers.
    expect(await healthzOver(first[0] as Probe)).toMatch(/^HTTP\/1\.1 200 /);
    const control = await fetch(`${cp.controlUrl}/healthz`);
    expect(control.status).toBe(200);
    // A closed connection frees its address's slot (once the server has seen it close).
    const leaving = first[1] as Probe;
    leaving.socket.destroy();
    await leaving.closed;
    expect(await healthzFromNewConnection(cp.publicUrl)).toMatch(/^HTTP\/1\.1 200 /);
  });

  it("keeps one address flooding the control listener from locking out another", async () => {
    // The per-address cap is left to its default: a quarter of the control cap, here 2.
    const cp = await controlPlane({ maxControlConnections: 8 });
    const flood = Array.from({ length: 8 }, () => probe(cp.controlUrl));
    await Promise.all(flood.map((p) => p.connected));
    const other = probe(cp.controlUrl, "127.0.0.2");
    await other.connected;
    const answer = await Promise.race([
      healthzOver(other),
      other.closed.then(() => "closed without an answer"),
    ]);
    expect(answer).toMatch(/^HTTP\/1\.1 200 /);
    // The flood itself got two connections; the other six were closed without a byte.
    const held = await Promise.all(
      flood.map((p) => Promise.race([healthzOver(p), p.closed.then(({ received }) => received)])),
    );
    expect(held.filter((r) => r.startsWith("HTTP/1.1 200 "))).toHaveLength(2);
    expect(held.filter((r) => r === "")).toHaveLength(6);
  });

  it.skipIf(!hasIpv6Loopback)(
    "on a dual-stack listener, caps ::1 apart from IPv4 clients and each IPv4 address apart",
    async () => {
      // A test host has one address in each /64 (loopback is ::1/128 alone), so this holds the
      // real listener to the address forms Node gives (::1, ::ffff:127.0.0.1); that two
      // addresses of one /64 share a cap is held on the cap's accounting, with real sockets,
      // in apps/router/src/http-listener.test.ts.
      const cp = await controlPlane({
        listen: "[::]:0",
        maxConnections: 8,
        maxConnectionsPerAddress: 2,
      });
      const port = new URL(cp.publicUrl).port;
      const v6 = `http://[::1]:${port}`;
      const v4 = `http://127.0.0.1:${port}`;
      const held = [probe(v6, "::1"), probe(v6, "::1")];
      await Promise.all(held.map((p) => p.connected));
      expect(await probe(v6, "::1").closed).toMatchObject({ received: "" });
      // IPv4 clients come in as ::ffff:127.0.0.x, in ::/64 like ::1: each is its own client.
      for (const localAddress of ["127.0.0.1", "127.0.0.2"]) {
        const p = probe(v4, localAddress);
        await p.connected;
        const answer = await Promise.race([
          healthzOver(p),
          p.closed.then(() => "closed without an answer"),
        ]);
        expect(answer).toMatch(/^HTTP\/1\.1 200 /);
      }
      for (const p of held) expect(await healthzOver(p)).toMatch(/^HTTP\/1\.1 200 /);
    },
  );
});
