import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { connect, createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { ProcessSpec } from "@llmgw/supervisor";
import { FIXTURE_ENGINE_PATH } from "@llmgw/supervisor/testing";

export const fixtureEngine = FIXTURE_ENGINE_PATH;

/** A temp dir removed by the returned cleanup. */
export function tempDir(prefix: string): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** A spec running the fixture engine with `args`. */
export function engineSpec(
  dir: string,
  name: string,
  args: string[],
  extra: Partial<ProcessSpec> = {},
): ProcessSpec {
  return {
    argv: [process.execPath, fixtureEngine, ...args],
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
    logFile: join(dir, "logs", `${name}.log`),
    stopGraceMs: 2000,
    ...extra,
  };
}

/** Polls `check` every 20 ms until it returns a value other than undefined/false. */
export async function waitFor<T>(
  what: string,
  check: () => T | undefined | false,
  timeoutMs = 10_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = check();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline)
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** True while `pid` exists and is not a zombie. */
export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

export { freePort } from "../src/ports.js";

/** Resolves true if something accepts TCP connections on 127.0.0.1:port. */
export function portOpen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, "127.0.0.1");
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}

/**
 * Listens on 127.0.0.1:`port` and closes again: "bound" when the port was free, else the
 * error's code (`EADDRINUSE` while a socket still listens there).
 */
export function bindPort(port: number): Promise<string> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once("error", (error: NodeJS.ErrnoException) => resolve(error.code ?? error.message));
    server.listen(port, "127.0.0.1", () => server.close(() => resolve("bound")));
  });
}

/**
 * The inodes of the sockets listening on TCP `port` (any address, IPv4 or IPv6), from
 * `/proc/net/tcp{,6}`: which socket holds a port, so that a port another process took after
 * it was freed (tests run side by side) is not mistaken for the one a test opened.
 */
export function listeningSockets(port: number): string[] {
  const hexPort = port.toString(16).toUpperCase().padStart(4, "0");
  return ["/proc/net/tcp", "/proc/net/tcp6"].flatMap((file) => {
    let text: string;
    try {
      text = readFileSync(file, "utf8");
    } catch {
      return [];
    }
    return text
      .split("\n")
      .slice(1)
      .flatMap((line) => {
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
        const f = line.trim().split(/\s+/);
        const local = f[1] ?? "";
        return local.endsWith(`:${hexPort}`) && f[3] === "0A" ? [f[9] ?? ""] : [];
      });
  });
}

/** Parses "grandchild <pid> port <port>" lines out of a log tail. */
export function grandchildren(lines: readonly string[]): { pid: number; port: number }[] {
  return lines.flatMap((line) => {
    const m = /^grandchild (\d+) port (\d+)$/.exec(line);
    return m === null ? [] : [{ pid: Number(m[1]), port: Number(m[2]) }];
  });
}
