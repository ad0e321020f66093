/**
 * `llmgw router` composed from its {@link RouterConfig}, without process globals (the CLI's
 * command owns argv, env and signals): reads the token, TLS and CA files, prepares the state
 * dir and the router id, starts THE router server and the metrics listener.
 */
import { readFile } from "node:fs/promises";
import type { Server, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { Registry } from "prom-client";
import type { RouterConfig } from "./config.js";
import { RouterServiceError } from "./errors.js";
import { createHttpListener } from "./http-listener.js";
import {
  answerHealth,
  type RouterStopReport,
  type RunningRouter,
  splitListen,
  startRouter,
  stopListening,
} from "./server.js";
import { prepareStateDir, resolveRouterId } from "./state-file.js";

/** Collaborators of {@link startRouterDaemon}. */
export interface RouterDaemonDeps {
  /** The llmgw version, sent to the control plane for `llmgw routers`. */
  readonly version: string;
  readonly log?: (event: Readonly<Record<string, unknown>>) => void;
  /** The process's uid for the state dir's owner check (`process.getuid()`). */
  readonly uid?: number;
}

/** A running `llmgw router`. */
export interface RouterDaemon {
  readonly router: RunningRouter;
  readonly routerId: string;
  /** `http://host:port` of `/metrics`; undefined with `--metrics-listen off`. */
  readonly metricsUrl: string | undefined;
  /** Graceful stop: the public listener within `config.shutdownGraceMs`, then the rest. */
  close(): Promise<RouterStopReport>;
}

/** Largest router token file read. */
const MAX_TOKEN_FILE_BYTES = 4096;

/**
 * Starts `llmgw router`.
 * @throws RouterServiceError `LLMGW_ROUTER_CONFIG_INVALID` (token file unreadable, empty or
 *   malformed; CA file unreadable), `LLMGW_ROUTER_TLS_INVALID`, `LLMGW_ROUTER_STATE_FAILED`,
 *   `LLMGW_ROUTER_LISTEN_FAILED`.
 */
export async function startRouterDaemon(
  config: RouterConfig,
  deps: RouterDaemonDeps,
): Promise<RouterDaemon> {
  const log = deps.log ?? (() => {});
  const routerToken = await readRouterToken(config);
  const ca =
    config.controlPlaneCaFile === undefined
      ? undefined
      : await readConfigFile(config.controlPlaneCaFile, "--control-plane-ca");
  const tls =
    config.tlsCertFile === undefined || config.tlsKeyFile === undefined
      ? undefined
      : {
          cert: await readTlsFile(config.tlsCertFile, "--tls-cert"),
          key: await readTlsFile(config.tlsKeyFile, "--tls-key"),
        };
  await prepareStateDir(config.stateDir, deps.uid);
  const routerId = await resolveRouterId(config.stateDir, config.routerId);
  const peerKey = await readPeerKey(config);
  const peerCa =
    config.peerCaFile === undefined
      ? undefined
      : await readConfigFile(config.peerCaFile, "--peer-ca");
  const registry = new Registry();
  const router = await startRouter({
    routing: {
      controlPlanes: config.controlPlanes,
      routerToken,
      ...(ca === undefined ? {} : { controlPlaneCa: ca }),
      routerId,
      address: config.address,
      version: deps.version,
      stateDir: config.stateDir,
      ...(config.maxStateAgeMs === undefined ? {} : { maxStateAgeMs: config.maxStateAgeMs }),
    },
    router: config.router,
    listener: { ...config.listener, ...(tls === undefined ? {} : { tls }) },
    listen: config.listen,
    registry,
    log,
    ...(peerKey === undefined
      ? {}
      : {
          peers: {
            urls: config.peers,
            key: peerKey,
            ...(peerCa === undefined ? {} : { ca: peerCa }),
          },
        }),
  });
  let metricsServer: Server | undefined;
  let metricsUrl: string | undefined;
  if (config.metricsListen !== undefined) {
    try {
      metricsServer = await startMetricsListener(config.metricsListen, router, registry);
      const { host } = splitListen(config.metricsListen);
      const port = (metricsServer.address() as AddressInfo).port;
      metricsUrl = `http://${host === "" ? "127.0.0.1" : host.includes(":") ? `[${host}]` : host}:${port}`;
    } catch (error) {
      await router.close(0);
      throw error;
    }
  }
  return {
    router,
    routerId,
    metricsUrl,
    async close() {
      // The public listener first (in-flight requests finish); /metrics until the end.
      const report = await router.stop(config.shutdownGraceMs);
      if (metricsServer !== undefined) await stopListening(metricsServer, 1_000);
      return report;
    },
  };
}

/** `/metrics`, `/readyz`, `/healthz` on their own address (kept off the public listener). */
async function startMetricsListener(
  listen: string,
  router: RunningRouter,
  registry: Registry,
): Promise<Server> {
  const { host, port } = splitListen(listen);
  const server = createHttpListener(
    { maxConnections: 64, maxConnectionsPerAddress: 16, requestTimeoutMs: 30_000 },
    (req, res: ServerResponse) => {
      const path = (req.url ?? "/").split("?", 1)[0] ?? "/";
      if (answerHealth(router.runtime, path, res)) return;
      if (path === "/metrics" && req.method === "GET") {
        registry.metrics().then(
          (body) => res.writeHead(200, { "content-type": registry.contentType }).end(body),
          (error: unknown) =>
            res.writeHead(500, { "content-type": "text/plain" }).end(String(error)),
        );
        return;
      }
      res
        .writeHead(404, { "content-type": "application/json" })
        .end('{"error":"not found: /metrics, /readyz, /healthz"}');
    },
  );
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host === "" ? undefined : host, () => {
      server.off("error", reject);
      resolve();
    });
  }).catch((cause: unknown) => {
    throw new RouterServiceError(
      "LLMGW_ROUTER_LISTEN_FAILED",
      `cannot listen on --metrics-listen ${listen}: ${(cause as Error).message}`,
      { cause },
    );
  });
  return server;
}

async function readRouterToken(config: RouterConfig): Promise<string> {
  const source = config.routerToken;
  if (source.kind !== "file") return source.token;
  return readOneLine(
    source.path,
    "--router-token-file",
    "one token on one line (the output of 'llmgw control-plane token --router')",
  );
}

async function readPeerKey(config: RouterConfig): Promise<string | undefined> {
  const source = config.peerKey;
  if (source === undefined || source.kind === "env") return source?.key.trim();
  return readOneLine(
    source.path,
    "--peer-key-file",
    "one key on one line (e.g. 'openssl rand -hex 32', the same file on every router)",
  );
}

/** A secret file's one line, trimmed; refused when empty or holding whitespace. */
async function readOneLine(file: string, flag: string, what: string): Promise<string> {
  const text = (await readConfigFile(file, flag, MAX_TOKEN_FILE_BYTES)).toString("utf8").trim();
  if (text === "" || /\s/.test(text)) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_CONFIG_INVALID",
      `${flag} ${file} must hold ${what}`,
    );
  }
  return text;
}

async function readConfigFile(file: string, flag: string, maxBytes = 1 << 20): Promise<Buffer> {
  let data: Buffer;
  try {
    data = await readFile(file);
  } catch (cause) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_CONFIG_INVALID",
      `${flag} ${file}: cannot read it: ${(cause as NodeJS.ErrnoException).code ?? (cause as Error).message}`,
      { cause },
    );
  }
  if (data.length > maxBytes) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_CONFIG_INVALID",
      `${flag} ${file}: ${data.length} bytes, over the ${maxBytes} byte limit`,
    );
  }
  return data;
}

async function readTlsFile(file: string, flag: string): Promise<Buffer> {
  try {
    return await readConfigFile(file, flag);
  } catch (error) {
    throw new RouterServiceError("LLMGW_ROUTER_TLS_INVALID", (error as Error).message, {
      cause: error,
    });
  }
}
