import { isIPv6 } from "node:net";

/**
 * The key a per-address limit counts a client address under (`socket.remoteAddress`): an IPv4
 * address as it is; an IPv6 address by its /64, as `2001:db8:1:2::/64`, because one IPv6 host
 * normally holds a whole /64 and can open each connection from another address of it. An
 * IPv4-mapped address (`::ffff:192.0.2.1`, how a dual-stack listener reports an IPv4 client)
 * counts as its IPv4 address: its /64 is `::/64`, which would put every IPv4 client under one
 * key. A zone id (Node adds one to a link-local peer: `fe80::1%eth0`) stays, as
 * `fe80::%eth0/64`: each link is its own /64. Any other text (no address) is returned as it is.
 */
export function clientAddressKey(address: string): string {
  const zoneAt = address.indexOf("%");
  const ip = zoneAt < 0 ? address : address.slice(0, zoneAt);
  if (!isIPv6(ip)) return address;
  const h = hextets(ip);
  if (h[0] === 0 && h[1] === 0 && h[2] === 0 && h[3] === 0 && h[4] === 0 && h[5] === 0xffff) {
    const a = h[6] ?? 0;
    const b = h[7] ?? 0;
    return `${a >> 8}.${a & 0xff}.${b >> 8}.${b & 0xff}`;
  }
  // RFC 5952 form: the zero host half is the longest run of zero groups (a run within the
  // prefix is at most three), so `::` replaces it and the prefix's own trailing zero groups.
  const prefix = h.slice(0, 4);
  while (prefix.length > 0 && prefix[prefix.length - 1] === 0) prefix.pop();
  const zone = zoneAt < 0 ? "" : address.slice(zoneAt);
  return `${prefix.map((g) => g.toString(16)).join(":")}::${zone}/64`;
}

/** The eight 16-bit groups of a valid IPv6 address (no zone id). */
function hextets(ip: string): number[] {
  // A dotted IPv4 tail (`::ffff:192.0.2.1`) is the last two groups.
  const dotted = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(ip);
  const group = (high: number, low: number) =>
    (Number(dotted?.[high]) * 256 + Number(dotted?.[low])).toString(16);
  const text = dotted === null ? ip : `${ip.slice(0, dotted.index)}${group(1, 2)}:${group(3, 4)}`;
  const [head = "", tail] = text.split("::");
  const left = head === "" ? [] : head.split(":");
  const right = tail === undefined || tail === "" ? [] : tail.split(":");
  const zeros = tail === undefined ? [] : Array<string>(8 - left.length - right.length).fill("0");
  return [...left, ...zeros, ...right].map((g) => Number.parseInt(g, 16));
}
