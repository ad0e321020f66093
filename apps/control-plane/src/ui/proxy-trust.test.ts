import type { IncomingMessage } from "node:http";
import { describe, expect, it } from "vitest";
import { forwardedClient, MAX_TRUSTED_PROXIES, parseTrustedProxies } from "./proxy-trust.js";

/** The two things `forwardedClient` reads of a request: its peer and its headers. */
function request(peer: string, headers: Record<string, string | string[]> = {}): IncomingMessage {
  return { socket: { remoteAddress: peer }, headers } as unknown as IncomingMessage;
}

function trust(...entries: string[]) {
  const parsed = parseTrustedProxies(entries);
  if (typeof parsed === "string") throw new Error(parsed);
  return parsed;
}

describe("parseTrustedProxies", () => {
  it("takes addresses and CIDR ranges of both families", () => {
    const t = trust("10.0.0.0/8", "192.0.2.7", "fd00::/8", "2001:db8::1");
    expect(t.trusts("10.200.3.4")).toBe(true);
    expect(t.trusts("11.0.0.1")).toBe(false);
    expect(t.trusts("192.0.2.7")).toBe(true);
    expect(t.trusts("192.0.2.8")).toBe(false);
    expect(t.trusts("fd12:3456::1")).toBe(true);
    expect(t.trusts("2001:db8::1")).toBe(true);
    expect(t.trusts("2001:db8::2")).toBe(false);
    // How Node reports an IPv4 client on a dual-stack listener.
    expect(t.trusts("::ffff:10.1.2.3")).toBe(true);
    expect(t.trusts("not an address")).toBe(false);
  });

  it.each([
    ["10.0.0.0/33", '"10.0.0.0/33" is not an IP address or CIDR range'],
    ["fd00::/129", '"fd00::/129" is not an IP address or CIDR range'],
    ["10.0.0.0/", '"10.0.0.0/" is not an IP address or CIDR range'],
    ["10.0.0.0/8/8", '"10.0.0.0/8/8" is not an IP address or CIDR range'],
    ["10.0.0.0/-1", '"10.0.0.0/-1" is not an IP address or CIDR range'],
    ["proxy.example", '"proxy.example" is not an IP address or CIDR range'],
    ["", '"" is not an IP address or CIDR range'],
    ["0.0.0.0/0", '"0.0.0.0/0" would trust every peer to name its own address'],
    ["::/0", '"::/0" would trust every peer to name its own address'],
  ])("refuses %j", (entry, message) => {
    expect(parseTrustedProxies([entry])).toContain(message);
  });

  it("refuses more than MAX_TRUSTED_PROXIES entries", () => {
    const many = Array.from(
      { length: MAX_TRUSTED_PROXIES + 1 },
      (_, i) => `10.0.${i >> 8}.${i & 255}`,
    );
    expect(parseTrustedProxies(many)).toBe(
      `at most ${MAX_TRUSTED_PROXIES} trusted proxies, got ${MAX_TRUSTED_PROXIES + 1}`,
    );
  });
});

describe("forwardedClient", () => {
  const proxies = trust("127.0.0.1", "10.0.0.0/8");

  it("ignores the forwarding headers of a peer it does not trust, whatever they say", () => {
    const req = request("198.51.100.4", {
      "x-forwarded-for": "203.0.113.9",
      "x-forwarded-proto": "https",
    });
    expect(forwardedClient(req, proxies, false)).toEqual({
      address: "198.51.100.4",
      secure: false,
    });
    expect(forwardedClient(req, undefined, false)).toEqual({
      address: "198.51.100.4",
      secure: false,
    });
    expect(forwardedClient(req, proxies, true).secure).toBe(true);
  });

  it("takes the nearest untrusted hop as the client, past trusted proxies", () => {
    const client = (xff: string | string[]) =>
      forwardedClient(request("127.0.0.1", { "x-forwarded-for": xff }), proxies, false);
    expect(client("203.0.113.9")).toEqual({
      address: "203.0.113.9",
      secure: false,
      via: "127.0.0.1",
    });
    // Two proxies: the inner one appended the outer one's address.
    expect(client("203.0.113.9, 10.1.1.1").address).toBe("203.0.113.9");
    // Whatever the client wrote itself lies left of the hop its proxy appended.
    expect(client("192.0.2.1, 203.0.113.9").address).toBe("203.0.113.9");
    expect(client(["192.0.2.1", "203.0.113.9"]).address).toBe("203.0.113.9");
    // A port some proxies append (Azure Application Gateway, IIS ARR) is not part of it.
    expect(client("203.0.113.9:5123").address).toBe("203.0.113.9");
    expect(client("[2001:db8::7]:443, 10.1.1.1:80").address).toBe("2001:db8::7");
    expect(client("[2001:db8::7]").address).toBe("2001:db8::7");
    // A chain longer than the walk looks at: its 32nd hop from the right, never further.
    const chain = Array.from({ length: 40 }, (_, i) => `10.0.0.${i + 1}`);
    expect(client(chain.join(", ")).address).toBe("10.0.0.9");
    // Only trusted hops: the farthest of them.
    expect(client("10.9.9.9, 10.1.1.1").address).toBe("10.9.9.9");
  });

  it("stops at a hop that is not an address, keeping the proxy that passed it", () => {
    const req = request("127.0.0.1", { "x-forwarded-for": "203.0.113.9, unknown" });
    expect(forwardedClient(req, proxies, false).address).toBe("127.0.0.1");
    const none = request("127.0.0.1");
    expect(forwardedClient(none, proxies, false)).toEqual({
      address: "127.0.0.1",
      secure: false,
      via: "127.0.0.1",
    });
  });

  it("is secure when the outermost proxy says https", () => {
    const secure = (proto: string) =>
      forwardedClient(request("10.0.0.2", { "x-forwarded-proto": proto }), proxies, false).secure;
    expect(secure("https")).toBe(true);
    expect(secure("HTTPS")).toBe(true);
    expect(secure("http")).toBe(false);
    expect(secure("https, http")).toBe(true);
    expect(secure("http, https")).toBe(false);
  });
});
