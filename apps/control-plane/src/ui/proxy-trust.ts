/**
 * Who is really asking, when the control listener sits behind a reverse proxy. The console
 * throttles failed logins per client address and marks its cookie `Secure` under TLS; behind
 * a TLS-terminating proxy every request comes from the proxy's address over plain HTTP, so one
 * client's failed logins would lock every operator out and the cookie would lose `Secure`.
 * `--trusted-proxy` names the proxies whose `X-Forwarded-For` and `X-Forwarded-Proto` count;
 * from anyone else those headers are ignored, since a client can write them.
 */
import type { IncomingMessage } from "node:http";
import { BlockList, isIP } from "node:net";

/** The proxies whose forwarding headers are believed. */
export interface ProxyTrust {
  /** True when `address` (as `socket.remoteAddress` gives it) is a trusted proxy. */
  trusts(address: string): boolean;
}

/** The client as far as trusted proxies tell it. */
export interface ForwardedClient {
  /** The client's address: the peer's, or the nearest untrusted hop of `X-Forwarded-For`. */
  readonly address: string;
  /** The connection the client made was TLS (to us, or to a trusted proxy). */
  readonly secure: boolean;
  /** The trusted proxy that passed the request on, when one did. */
  readonly via?: string;
}

/** Most entries of `--trusted-proxy`. */
export const MAX_TRUSTED_PROXIES = 256;
/** Most `X-Forwarded-For` hops looked at (a longer chain's 32nd hop is taken as the client). */
const MAX_FORWARDED_HOPS = 32;

/**
 * An address as the trust list keys it: IPv4-mapped IPv6 (`::ffff:1.2.3.4`) as IPv4, and a
 * port that some proxies append (`203.0.113.9:5123`, `[2001:db8::1]:443`) dropped.
 */
function plain(address: string): string {
  const withPort =
    /^(\d+\.\d+\.\d+\.\d+):\d{1,5}$/.exec(address) ?? /^\[([^\]]+)\](?::\d{1,5})?$/.exec(address);
  const host = withPort?.[1] ?? address;
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(host);
  return mapped?.[1] ?? host;
}

/**
 * Parses `--trusted-proxy` entries: addresses (`10.0.0.7`, `fd00::1`) or CIDR ranges
 * (`10.0.0.0/8`, `fd00::/8`). Returns the reason for the first bad entry as a string.
 */
export function parseTrustedProxies(entries: readonly string[]): ProxyTrust | string {
  if (entries.length > MAX_TRUSTED_PROXIES)
    return `at most ${MAX_TRUSTED_PROXIES} trusted proxies, got ${entries.length}`;
  const list = new BlockList();
  for (const entry of entries) {
    const [address = "", prefixText, extra] = entry.split("/");
    const family = isIP(address);
    const max = family === 4 ? 32 : 128;
    const prefix = prefixText === undefined ? max : Number(prefixText);
    if (
      family === 0 ||
      extra !== undefined ||
      (prefixText !== undefined && !/^\d{1,3}$/.test(prefixText)) ||
      prefix > max
    ) {
      return `${JSON.stringify(entry.slice(0, 64))} is not an IP address or CIDR range (e.g. 10.0.0.5, 10.0.0.0/24)`;
    }
    if (prefix === 0) {
      return `${JSON.stringify(entry)} would trust every peer to name its own address: list the proxies' addresses`;
    }
    list.addSubnet(address, prefix, family === 4 ? "ipv4" : "ipv6");
  }
  return {
    trusts(address) {
      const a = plain(address);
      const family = isIP(a);
      return family !== 0 && list.check(a, family === 4 ? "ipv4" : "ipv6");
    },
  };
}

/** The values of a header that may be repeated or comma-joined, in order, blanks dropped. */
function values(header: string | string[] | undefined): string[] {
  return (Array.isArray(header) ? header.join(",") : (header ?? ""))
    .split(",")
    .map((v) => v.trim())
    .filter((v) => v !== "");
}

/**
 * The client of `req`. From a trusted peer, `X-Forwarded-For` is read right to left (each
 * proxy appends the address it saw) past the trusted hops; the first other hop is the client.
 * A hop that is not an IP address ends the walk at the proxy that passed it on: what lies
 * left of it is the client's own writing. `X-Forwarded-Proto: https` from a trusted peer (its
 * first value: the outermost proxy's, where the client's connection ended) makes the request
 * secure, as TLS on the listener does. A client that wrote it through a proxy that appends
 * only gets a `Secure` cookie its browser will not send back over plain HTTP.
 */
export function forwardedClient(
  req: IncomingMessage,
  trust: ProxyTrust | undefined,
  listenerTls: boolean,
): ForwardedClient {
  const peer = req.socket.remoteAddress ?? "unknown";
  if (trust === undefined || !trust.trusts(peer)) return { address: peer, secure: listenerTls };
  const secure =
    listenerTls || values(req.headers["x-forwarded-proto"])[0]?.toLowerCase() === "https";
  const hops = values(req.headers["x-forwarded-for"]);
  let address = peer;
  for (let i = hops.length - 1, seen = 0; i >= 0 && seen < MAX_FORWARDED_HOPS; i--, seen++) {
    const hop = plain(hops[i] as string);
    if (isIP(hop) === 0) break;
    address = hop;
    if (!trust.trusts(hop)) break;
  }
  return { address, secure, via: peer };
}
