import { readFileSync } from "node:fs";
import { type AddressInfo, createServer } from "node:net";
import { join } from "node:path";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { ClusterService } from "@llmgw/proto";
import { afterEach, describe, expect, it } from "vitest";
import { startControlPlane } from "../src/run.js";
import { hasOpenssl, selfSignedCert } from "../src/testing/self-signed.js";
import { adminClient, startTestControlPlane, tempDir } from "./helpers.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

describe("TLS and shutdown", () => {
  it.skipIf(!hasOpenssl())(
    "serves Connect and /healthz over TLS with the given certificate",
    async () => {
      const tmp = tempDir();
      cleanups.push(tmp.cleanup);
      const { cert, key } = selfSignedCert(tmp.dir);
      const cp = await startControlPlane({
        dataDir: join(tmp.dir, "data"),
        listen: "127.0.0.1:0",
        controlListen: "127.0.0.1:0",
        tlsCertFile: cert,
        tlsKeyFile: key,
      });
      cleanups.push(() => cp.close().then(() => {}));
      expect(cp.controlUrl).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/);
      expect(cp.publicUrl).toMatch(/^https:/);
      const client = createClient(
        ClusterService,
        createConnectTransport({
          httpVersion: "1.1",
          baseUrl: cp.controlUrl,
          nodeOptions: { ca: readFileSync(cert) },
          interceptors: [
            (next) => (req) => {
              req.header.set("authorization", `Bearer ${cp.adminToken}`);
              return next(req);
            },
          ],
        }),
      );
      expect((await client.getClusterStatus({})).nodesTotal).toBe(0);
    },
  );

  it("refuses to start with a missing certificate file", async () => {
    const tmp = tempDir();
    cleanups.push(tmp.cleanup);
    await expect(
      startControlPlane({
        dataDir: tmp.dir,
        listen: "127.0.0.1:0",
        controlListen: "127.0.0.1:0",
        tlsCertFile: join(tmp.dir, "nope.pem"),
        tlsKeyFile: join(tmp.dir, "nope.key"),
      }),
    ).rejects.toMatchObject({ code: "LLMGW_CONTROL_PLANE_TLS_INVALID" });
  });

  it("refuses a taken port naming the flag, and releases what it opened", async () => {
    const tmp = tempDir();
    cleanups.push(tmp.cleanup);
    const taken = createServer();
    await new Promise<void>((resolve) => taken.listen(0, "127.0.0.1", resolve));
    cleanups.push(() => new Promise<void>((resolve) => taken.close(() => resolve())));
    const port = (taken.address() as AddressInfo).port;
    await expect(
      startControlPlane({
        dataDir: tmp.dir,
        listen: `127.0.0.1:${port}`,
        controlListen: "127.0.0.1:0",
      }),
    ).rejects.toMatchObject({
      code: "LLMGW_CONTROL_PLANE_LISTEN_FAILED",
      message: expect.stringContaining(`cannot listen on 127.0.0.1:${port} (--listen)`),
    });
    // The failed start closed its store and control listener: the data dir starts again.
    const again = await startTestControlPlane(tmp.dir);
    await again.close();
  });

  it("ends open event streams and closes without force; the port is free afterwards", async () => {
    const tmp = tempDir();
    cleanups.push(tmp.cleanup);
    const cp = await startTestControlPlane(tmp.dir);
    const admin = adminClient(cp, cp.adminToken);
    const received: string[] = [];
    const watching = (async () => {
      for await (const res of admin.watchEvents({ backlog: 0 }))
        received.push(res.event?.kind ?? "");
      return "ended";
    })().catch((e: unknown) => `failed: ${(e as Error).message}`);
    await admin.createApiKey({ name: "k" });
    for (let i = 0; i < 50 && received.length === 0; i++)
      await new Promise((r) => setTimeout(r, 20));
    const report = await cp.close();
    expect(report.forced).toBe(false);
    expect(await watching).toBe("ended");
    expect(received).toEqual(["apikey.created"]);
    // Calls after close fail; a new control plane can take the data dir at once.
    await expect(admin.listNodes({})).rejects.toThrow();
    const again = await startTestControlPlane(tmp.dir);
    cleanups.push(() => again.close().then(() => {}));
    expect(
      (await adminClient(again, again.adminToken).listApiKeys({})).keys.map((k) => k.name),
    ).toEqual(["k"]);
  });

  it("rejects bad options naming the option and the value", async () => {
    await expect(
      startControlPlane({ dataDir: "/tmp/x", controlListen: "nope" }),
    ).rejects.toMatchObject({
      code: "LLMGW_CONTROL_PLANE_CONFIG_INVALID",
      message: expect.stringContaining(
        'controlListen: expected HOST:PORT or :PORT, e.g. 127.0.0.1:7070 (got "nope")',
      ),
    });
  });
});
