/**
 * The ports the agent hands to engines. A port is chosen here and bound by the engine moments
 * later, so it must be one nothing else takes meanwhile. The kernel hands out ports from its
 * ephemeral range (`net.ipv4.ip_local_port_range`, 32768–60999 by default) to every `bind(0)`
 * and to the local end of every outgoing connection, and a connection holding a port keeps a
 * listener off it; a port found free by `bind(0)` and released is the very kind the next
 * connection on a busy node gets (the e2e tests saw a router refused its port that way). So
 * ports come from below that range, 20000 up to it by default (Nomad's dynamic ports sit there
 * for the same reason), each tried by binding it, and `bind(0)` only when none is found.
 */
import { readFileSync } from "node:fs";
import { createServer } from "node:net";

/** Where engine ports are picked, inclusive, before the ephemeral range is cut off. */
export const ENGINE_PORT_RANGE = { low: 20_000, high: 32_767 } as const;
/** Linux's default ephemeral range, assumed where `/proc` does not say. */
const DEFAULT_EPHEMERAL = { low: 32_768, high: 60_999 } as const;
/** Random ports tried before `bind(0)`. */
const TRIES = 32;

/** Options of {@link freePort} (tests inject these). */
export interface FreePortOptions {
  /** Default {@link ENGINE_PORT_RANGE}. */
  readonly range?: { readonly low: number; readonly high: number };
  /** The kernel's ephemeral range. Default: read from `/proc`. */
  readonly ephemeral?: { readonly low: number; readonly high: number };
  /** A number in [0, 1). Default `Math.random`. */
  readonly random?: () => number;
}

/**
 * A TCP port free right now on all interfaces, outside the kernel's ephemeral range where one
 * is (the engine binds it moments later).
 */
export async function freePort(options: FreePortOptions = {}): Promise<number> {
  const range = options.range ?? ENGINE_PORT_RANGE;
  const ephemeral = options.ephemeral ?? ephemeralRange();
  const low = Math.max(1024, range.low);
  // The part of the range the kernel never hands out itself.
  const high = ephemeral.low > range.high || ephemeral.high < low ? range.high : ephemeral.low - 1;
  const random = options.random ?? Math.random;
  for (let i = 0; high >= low && i < TRIES; i++) {
    const port = low + Math.floor(random() * (high - low + 1));
    if ((await bindAndRelease(port)) !== undefined) return port;
  }
  const port = await bindAndRelease(0);
  if (port === undefined) throw new Error("no free TCP port: even bind(0) failed");
  return port;
}

/** `net.ipv4.ip_local_port_range`, or Linux's default where it cannot be read. */
export function ephemeralRange(file = "/proc/sys/net/ipv4/ip_local_port_range"): {
  low: number;
  high: number;
} {
  try {
    const [low, high] = readFileSync(file, "utf8").trim().split(/\s+/).map(Number);
    if (
      Number.isInteger(low) &&
      Number.isInteger(high) &&
      (low as number) > 0 &&
      (low as number) <= (high as number) &&
      (high as number) <= 65_535
    )
      return { low: low as number, high: high as number };
  } catch {
    // Not Linux, or no /proc: the default below.
  }
  return { ...DEFAULT_EPHEMERAL };
}

/** Binds `port` on all interfaces and lets it go: the port bound, or undefined when taken. */
function bindAndRelease(port: number): Promise<number | undefined> {
  return new Promise((resolve) => {
    const server = createServer();
    server.unref();
    server.once("error", () => resolve(undefined));
    server.listen(port, () => {
      const address = server.address();
      const bound = typeof address === "object" && address ? address.port : undefined;
      server.close(() => resolve(bound));
    });
  });
}
