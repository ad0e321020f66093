/**
 * A ready-made public listener for the router (tests, benchmarks, or a control plane that
 * needs nothing else on the port): header size and slow-client limits live on the server.
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { createRouterHandler, type RouterHandler, type RouterHandlerOptions } from "./handler.js";

/** Listener limits of {@link startRouterServer}. */
export interface RouterServerOptions extends RouterHandlerOptions {
  /** Default 127.0.0.1. */
  readonly host?: string;
  /** Default 0 (any free port). */
  readonly port?: number;
  /** Largest request head; larger answers 431. Default 16 KiB. */
  readonly maxHeaderBytes?: number;
  /** Time a client has to send the request head, ms. Default 10 000. */
  readonly headersTimeoutMs?: number;
  /** Time a client has to send the whole request, ms. Default 60 000. */
  readonly requestTimeoutMs?: number;
  /** Idle keep-alive connections are closed after this, ms. Default 5 000. */
  readonly keepAliveTimeoutMs?: number;
}

/** A listening router. */
export interface RunningRouterServer {
  /** `http://host:port`. */
  readonly url: string;
  readonly port: number;
  readonly server: Server;
  readonly handler: RouterHandler;
  /** Stops accepting, drops open connections, then closes the handler. */
  close(): Promise<void>;
}

/** Node `http.createServer` options enforcing the router's header and slow-client limits. */
export function routerHttpServerOptions(options: RouterServerOptions): {
  maxHeaderSize: number;
  headersTimeout: number;
  requestTimeout: number;
  keepAliveTimeout: number;
  noDelay: true;
} {
  return {
    maxHeaderSize: options.maxHeaderBytes ?? 16 * 1024,
    headersTimeout: options.headersTimeoutMs ?? 10_000,
    requestTimeout: options.requestTimeoutMs ?? 60_000,
    keepAliveTimeout: options.keepAliveTimeoutMs ?? 5_000,
    noDelay: true,
  };
}

/** Creates the handler, listens, and resolves once the port is open. */
export async function startRouterServer(
  options: RouterServerOptions,
): Promise<RunningRouterServer> {
  const handler = createRouterHandler(options);
  const httpOptions = routerHttpServerOptions(options);
  const server = createServer({ maxHeaderSize: httpOptions.maxHeaderSize, noDelay: true }, handler);
  server.headersTimeout = httpOptions.headersTimeout;
  server.requestTimeout = httpOptions.requestTimeout;
  server.keepAliveTimeout = httpOptions.keepAliveTimeout;
  const host = options.host ?? "127.0.0.1";
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port ?? 0, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://${host}:${port}`,
    port,
    server,
    handler,
    async close() {
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
      await handler.close();
    },
  };
}
