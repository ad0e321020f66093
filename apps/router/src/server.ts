/**
 * A ready-made public listener for the router (tests, benchmarks, or a control plane that
 * needs nothing else on the port), built by the same {@link createHttpListener} as
 * production's listeners: header size, slow-client and connection limits live on the server.
 */
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { createRouterHandler, type RouterHandler, type RouterHandlerOptions } from "./handler.js";
import { createHttpListener, type HttpListenerOptions } from "./http-listener.js";

/** Options of {@link startRouterServer}: the handler's, the listener's, and where to listen. */
export interface RouterServerOptions extends RouterHandlerOptions, HttpListenerOptions {
  /** Default 127.0.0.1. */
  readonly host?: string;
  /** Default 0 (any free port). */
  readonly port?: number;
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

/** Creates the handler, listens, and resolves once the port is open. */
export async function startRouterServer(
  options: RouterServerOptions,
): Promise<RunningRouterServer> {
  const handler = createRouterHandler(options);
  const server = createHttpListener(options, handler);
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
    url: `${options.tls ? "https" : "http"}://${host}:${port}`,
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
