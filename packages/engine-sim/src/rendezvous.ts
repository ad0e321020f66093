import { createConnection, createServer, type Server, type Socket } from "node:net";
import { EngineSimError } from "./errors.js";

/** Rank 0's side of the multi-node rendezvous (like SGLang's `--dist-init-addr` TCP store). */
export interface RendezvousServer {
  /** Resolves when every rank 1..nnodes-1 has joined; rejects on timeout. */
  readonly allJoined: Promise<void>;
  readonly port: number;
  close(): void;
}

/**
 * Listens on `host:port` for ranks 1..`nnodes - 1`. Each sends `hello <rank>\n` and keeps the
 * connection open; a connection that closes after joining calls `onRankLost(rank)`.
 */
export async function listenRendezvous(options: {
  host: string;
  port: number;
  nnodes: number;
  timeoutMs: number;
  log: (line: string) => void;
  onRankLost: (rank: number) => void;
}): Promise<RendezvousServer> {
  const joined = new Map<number, Socket>();
  const sockets = new Set<Socket>();
  let closed = false;
  let resolveAll!: () => void;
  let rejectAll!: (error: Error) => void;
  const allJoined = new Promise<void>((resolve, reject) => {
    resolveAll = resolve;
    rejectAll = reject;
  });
  allJoined.catch(() => {});
  if (options.nnodes <= 1) resolveAll();
  const server: Server = createServer((socket) => {
    sockets.add(socket);
    socket.setNoDelay(true);
    let buffer = "";
    let rank: number | undefined;
    socket.on("data", (data) => {
      if (rank !== undefined) return;
      buffer += data.toString("utf8");
      const nl = buffer.indexOf("\n");
      if (nl < 0) return;
      const m = /^hello (\d+)$/.exec(buffer.slice(0, nl));
      const r = m ? Number(m[1]) : Number.NaN;
      if (!(r >= 1 && r < options.nnodes) || joined.has(r)) {
        options.log(`WARNING rendezvous: rejected ${JSON.stringify(buffer.slice(0, nl))}`);
        socket.destroy();
        return;
      }
      rank = r;
      joined.set(r, socket);
      socket.write("welcome\n");
      options.log(
        `INFO rendezvous: rank ${r} joined from ${socket.remoteAddress}:${socket.remotePort} (${joined.size + 1}/${options.nnodes} ranks)`,
      );
      if (joined.size === options.nnodes - 1) {
        clearTimeout(timer);
        resolveAll();
      }
    });
    socket.on("error", () => {});
    socket.on("close", () => {
      sockets.delete(socket);
      if (rank !== undefined && joined.get(rank) === socket) {
        joined.delete(rank);
        if (!closed) options.onRankLost(rank);
      }
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", (error) =>
      reject(
        new EngineSimError(
          "LLMGW_ENGINE_SIM_LISTEN_FAILED",
          `cannot listen on dist-init-addr ${options.host}:${options.port}: ${error.message}`,
          { cause: error },
        ),
      ),
    );
    server.listen(options.port, options.host, resolve);
  });
  const address = server.address();
  const port = typeof address === "object" && address ? address.port : options.port;
  options.log(
    `INFO rendezvous: listening on ${options.host}:${port} for ${options.nnodes - 1} ranks`,
  );
  const timer = setTimeout(() => {
    rejectAll(
      new EngineSimError(
        "LLMGW_ENGINE_SIM_RANK_LOST",
        `only ${joined.size + 1}/${options.nnodes} ranks joined within ${options.timeoutMs} ms`,
      ),
    );
  }, options.timeoutMs);
  timer.unref();
  return {
    allJoined,
    port,
    close() {
      closed = true;
      clearTimeout(timer);
      server.close();
      for (const socket of sockets) socket.destroy();
    },
  };
}

/** A rank ≥ 1's connection to rank 0. */
export interface RendezvousMember {
  close(): void;
}

/**
 * Connects to rank 0 (retrying every 250 ms until `timeoutMs`), says hello, waits for the
 * welcome, and calls `onLost` when the connection later closes.
 */
export async function joinRendezvous(options: {
  host: string;
  port: number;
  rank: number;
  timeoutMs: number;
  log: (line: string) => void;
  onLost: () => void;
}): Promise<RendezvousMember> {
  const deadline = Date.now() + options.timeoutMs;
  let lastError = "";
  while (Date.now() < deadline) {
    const socket = await new Promise<Socket | undefined>((resolve) => {
      const s = createConnection({ host: options.host, port: options.port });
      let buffer = "";
      const fail = (error: Error): void => {
        lastError = error.message;
        s.destroy();
        resolve(undefined);
      };
      s.once("error", fail);
      s.once("connect", () => s.write(`hello ${options.rank}\n`));
      s.on("data", (data) => {
        buffer += data.toString("utf8");
        if (buffer.includes("welcome\n")) {
          s.removeListener("error", fail);
          s.removeAllListeners("data");
          resolve(s);
        }
      });
      s.once("close", () => {
        lastError ||= "closed before welcome";
        resolve(undefined);
      });
    });
    if (socket) {
      let closed = false;
      socket.on("error", () => {});
      socket.on("close", () => {
        if (!closed) options.onLost();
      });
      options.log(
        `INFO rendezvous: rank ${options.rank} joined rank 0 at ${options.host}:${options.port}`,
      );
      return {
        close() {
          closed = true;
          socket.destroy();
        },
      };
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  throw new EngineSimError(
    "LLMGW_ENGINE_SIM_RANK_LOST",
    `rank ${options.rank} could not join rank 0 at ${options.host}:${options.port} within ${options.timeoutMs} ms: ${lastError}`,
  );
}
