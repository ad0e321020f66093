import type { NetworkInterfaceInfo } from "node:os";
import { describe, expect, it } from "vitest";
import { resolveDiscoveryOptions } from "./discover.js";
import { isDiscoveryError } from "./errors.js";
import { collectAddresses } from "./host.js";

describe("resolveDiscoveryOptions", () => {
  it("applies defaults", () => {
    const resolved = resolveDiscoveryOptions({ hostname: "h" });
    expect(resolved).toMatchObject({
      nvidiaSmiPath: "nvidia-smi",
      amdSmiPath: "amd-smi",
      rocmSmiPath: "rocm-smi",
      sysfsRoot: "/sys/class/infiniband",
      timeoutMs: 10_000,
      agentVersion: "0.0.0",
      hostname: "h",
    });
    expect(resolved.fabricNames.size).toBe(0);
    expect(resolved.managedPids.size).toBe(0);
  });

  it("accepts fabric names as a record or a map, pids as any iterable", () => {
    const a = resolveDiscoveryOptions({ fabricNames: { mlx5_0: "rail-0" }, managedPids: [7, 8] });
    const b = resolveDiscoveryOptions({
      fabricNames: new Map([["mlx5_0", "rail-0"]]),
      managedPids: new Set([7, 8]),
    });
    expect([...a.fabricNames]).toEqual([["mlx5_0", "rail-0"]]);
    expect([...b.fabricNames]).toEqual([["mlx5_0", "rail-0"]]);
    expect([...a.managedPids]).toEqual([7, 8]);
  });

  it.each([
    [
      { timeoutMs: 0 },
      "discovery option timeoutMs must be a positive integer (milliseconds); got 0",
    ],
    [
      { timeoutMs: 1.5 },
      "discovery option timeoutMs must be a positive integer (milliseconds); got 1.5",
    ],
    [{ nvidiaSmiPath: " " }, 'discovery option nvidiaSmiPath must not be empty; got " "'],
    [{ sysfsRoot: "" }, 'discovery option sysfsRoot must not be empty; got ""'],
    [{ amdSmiPath: "" }, 'discovery option amdSmiPath must not be empty; got ""'],
    [{ rocmSmiPath: "  " }, 'discovery option rocmSmiPath must not be empty; got "  "'],
    [
      { fabricNames: { mlx5_0: "" } },
      'discovery option fabricNames must map device names to non-empty fabric ids; got {"mlx5_0":""}',
    ],
    [{ managedPids: [-1] }, "discovery option managedPids must hold positive integers; got [-1]"],
  ])("%j is refused with %j", (options, message) => {
    let caught: unknown;
    try {
      resolveDiscoveryOptions(options);
    } catch (error) {
      caught = error;
    }
    expect(isDiscoveryError(caught)).toBe(true);
    expect((caught as Error).message).toBe(message);
  });
});

describe("collectAddresses", () => {
  const info = (address: string, family: "IPv4" | "IPv6", internal = false) =>
    ({
      address,
      family,
      internal,
      netmask: "",
      mac: "",
      cidr: null,
    }) as unknown as NetworkInterfaceInfo;

  it("drops loopback and link-local, IPv4 first", () => {
    expect(
      collectAddresses({
        lo: [info("127.0.0.1", "IPv4", true), info("::1", "IPv6", true)],
        eth0: [info("2001:db8::5", "IPv6"), info("fe80::1", "IPv6"), info("10.0.0.5", "IPv4")],
        ib0: [info("192.168.1.5", "IPv4")],
        down: undefined,
      }),
    ).toEqual(["10.0.0.5", "192.168.1.5", "2001:db8::5"]);
  });
});
