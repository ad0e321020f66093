/**
 * An HTTP server for {@link createKvCacheService}: what `llmgw agent --kv-listen` runs (and the
 * routing benchmark beside its simulators). Plain HTTP/1.1 Connect; the engine key each call
 * carries is the access check, so bind it where routers reach it and nothing else needs to.
 */
import { createServer, type Server } from "node:http";
import type { ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { KvCacheService } from "@llmgw/proto";
import { KvEventsError } from "./errors.js";
import { createKvCacheService, type KvFeedRegistry } from "./service.js";

/**
 * Largest request message read: a `WatchBlocksRequest` is one replica id. The request is read
 * whole before the engine key is checked, and Connect's default bound is 4 GiB, so without this
 * anyone who reached the port could make the agent buffer that much per call.
 */
export const MAX_WATCH_REQUEST_BYTES = 64 * 1024;

/** A running server. */
export interface KvCacheServer {
  /** e.g. `http://127.0.0.1:7073`. */
  readonly url: string;
  readonly port: number;
  close(): Promise<void>;
}

/** Options of {@link startKvCacheServer}. */
export interface KvCacheServerOptions {
  readonly registry: KvFeedRegistry;
  /** Address to bind (default 127.0.0.1). */
  readonly host?: string;
  /** Port (default 0: any free one). */
  readonly port?: number;
  /** Keepalive interval of each watch (default 5 s). */
  readonly keepaliveMs?: number;
}

/** Starts serving; rejects with `LLMGW_KV_EVENTS_SOCKET_FAILED` when it cannot bind. */
export async function startKvCacheServer(options: KvCacheServerOptions): Promise<KvCacheServer> {
  const service = createKvCacheService(
    options.registry,
    options.keepaliveMs === undefined ? {} : { keepaliveMs: options.keepaliveMs },
  );
  const handler = connectNodeAdapter({
    readMaxBytes: MAX_WATCH_REQUEST_BYTES,
    routes: (r: ConnectRouter) => {
      r.service(KvCacheService, service);
    },
  });
  const server: Server = createServer(handler);
  const host = options.host ?? "127.0.0.1";
  await new Promise<void>((resolve, reject) => {
    server.once("error", (cause) =>
      reject(
        new KvEventsError(
          "LLMGW_KV_EVENTS_SOCKET_FAILED",
          `could not listen on ${host}:${options.port ?? 0}: ${(cause as Error).message}`,
          { cause },
        ),
      ),
    );
    server.listen(options.port ?? 0, host, () => resolve());
  });
  const address = server.address();
  const port = typeof address === "object" && address !== null ? address.port : 0;
  const shown = host.includes(":") ? `[${host}]` : host;
  return {
    url: `http://${shown === "0.0.0.0" ? "127.0.0.1" : shown}:${port}`,
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
