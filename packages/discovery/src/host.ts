import type { NetworkInterfaceInfo } from "node:os";
import os from "node:os";
import type { HostFacts } from "./types.js";

/** CPU count, memory, OS and architecture of this machine, from `node:os`. */
export function readHostFacts(): HostFacts {
  return {
    cpuCount: os.availableParallelism(),
    memoryBytes: os.totalmem(),
    os: os.type(),
    osRelease: os.release(),
    arch: os.arch(),
  };
}

/**
 * The node's addresses for peers: non-internal (no loopback), IPv4 first, then IPv6, each
 * group in interface order; IPv6 link-local (`fe80::`) is skipped (unusable without a zone).
 * Pure over an `os.networkInterfaces()`-shaped record.
 */
export function collectAddresses(
  interfaces: Readonly<Record<string, readonly NetworkInterfaceInfo[] | undefined>>,
): string[] {
  const all = Object.values(interfaces).flatMap((infos) => infos ?? []);
  const usable = all.filter((i) => !i.internal && !/^fe80:/i.test(i.address));
  const v4 = usable.filter((i) => i.family === "IPv4").map((i) => i.address);
  const v6 = usable.filter((i) => i.family !== "IPv4").map((i) => i.address);
  return [...new Set([...v4, ...v6])];
}

/** {@link collectAddresses} over this machine's interfaces. */
export function readAddresses(): string[] {
  return collectAddresses(os.networkInterfaces());
}
