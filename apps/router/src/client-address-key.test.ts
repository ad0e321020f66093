import { describe, expect, it } from "vitest";
import { clientAddressKey } from "./client-address-key.js";

describe("clientAddressKey", () => {
  it.each([
    // IPv4: each address on its own.
    ["192.0.2.1", "192.0.2.1"],
    ["127.0.0.1", "127.0.0.1"],
    // IPv4-mapped, as a dual-stack listener reports an IPv4 client: the IPv4 address.
    ["::ffff:192.0.2.1", "192.0.2.1"],
    ["::ffff:127.0.0.2", "127.0.0.2"],
    ["::FFFF:192.0.2.1", "192.0.2.1"],
    ["::ffff:c000:201", "192.0.2.1"],
    ["0:0:0:0:0:ffff:192.0.2.1", "192.0.2.1"],
    // IPv6: its /64, in RFC 5952 form.
    ["2001:db8:1:2::a", "2001:db8:1:2::/64"],
    ["2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"],
    ["2001:0db8:0001:0002:0000:0000:0000:0001", "2001:db8:1:2::/64"],
    ["2001:DB8:1:2::1", "2001:db8:1:2::/64"],
    ["2001:db8::1", "2001:db8::/64"],
    ["2001:db8:0:1::5", "2001:db8:0:1::/64"],
    ["2001:0:0:1::", "2001:0:0:1::/64"],
    ["2001:db8::192.0.2.1", "2001:db8::/64"],
    ["fd00::2", "fd00::/64"],
    ["::1", "::/64"],
    ["::", "::/64"],
    // Link-local with the zone id Node adds: the /64 of that link.
    ["fe80::1%eth0", "fe80::%eth0/64"],
    ["fe80::fc:ff:fe00:1%eth0", "fe80::%eth0/64"],
    ["fe80::1%2", "fe80::%2/64"],
    // Not an address (a socket already closed has none): as it is.
    ["", ""],
    ["unknown", "unknown"],
    ["2001:db8::1::2", "2001:db8::1::2"],
  ])("keys %j as %j", (address, key) => {
    expect(clientAddressKey(address)).toBe(key);
  });

  it.each([
    ["2001:db8:1:2::a", "2001:db8:1:2:ffff::1", true],
    ["2001:db8:1:2::a", "2001:db8:1:3::a", false],
    ["fe80::1%eth0", "fe80::2%eth0", true],
    ["fe80::1%eth0", "fe80::1%eth1", false],
    ["::ffff:192.0.2.1", "192.0.2.1", true],
    // Every IPv4-mapped address lies in ::/64: they must not all share ::1's key.
    ["::ffff:127.0.0.1", "::1", false],
    ["::ffff:192.0.2.1", "::ffff:192.0.2.2", false],
  ])("%j and %j share a key: %s", (a, b, shared) => {
    expect(clientAddressKey(a) === clientAddressKey(b)).toBe(shared);
  });
});
