import { mkdtempSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { ENGINE_PORT_RANGE, ephemeralRange, freePort } from "./ports.js";

const servers: Server[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => new Promise((r) => s.close(r))));
});

/** Holds a port the way an engine would; resolves with it. */
async function occupy(): Promise<number> {
  const port = await freePort();
  const server = createServer();
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(port, resolve));
  return port;
}

/** A `random` that lands on `ports` in turn within `range`. */
function landingOn(range: { low: number; high: number }, ...ports: number[]): () => number {
  return () => ((ports.shift() as number) - range.low + 0.5) / (range.high - range.low + 1);
}

describe("freePort", () => {
  it("picks below the kernel's ephemeral range, where bind(0) and connections never land", async () => {
    for (let i = 0; i < 20; i++) {
      const port = await freePort({ ephemeral: { low: 32_768, high: 60_999 } });
      expect(port).toBeGreaterThanOrEqual(ENGINE_PORT_RANGE.low);
      expect(port).toBeLessThanOrEqual(ENGINE_PORT_RANGE.high);
    }
  });

  it("passes over a port something listens on", async () => {
    const taken = await occupy();
    const range = { low: 20_000, high: 32_767 };
    const next = taken === range.high ? taken - 1 : taken + 1;
    const port = await freePort({
      range,
      ephemeral: { low: 32_768, high: 60_999 },
      random: landingOn(range, taken, next),
    });
    expect(port).toBe(next);
  });

  it("takes bind(0)'s port when every try lands on a taken one", async () => {
    const taken = await occupy();
    const range = { low: 20_000, high: 32_767 };
    let tries = 0;
    const port = await freePort({
      range,
      ephemeral: { low: 32_768, high: 60_999 },
      random: () => {
        tries += 1;
        return landingOn(range, taken)();
      },
    });
    expect(tries).toBe(32);
    expect(port).not.toBe(taken);
    // The kernel's own pick: from its ephemeral range.
    const kernel = ephemeralRange();
    expect(port).toBeGreaterThanOrEqual(kernel.low);
    expect(port).toBeLessThanOrEqual(kernel.high);
  });

  it("stops at the ephemeral range: a range inside it leaves bind(0)", async () => {
    const range = { low: 20_000, high: 32_767 };
    // The whole range is ephemeral: no random port is tried.
    const port = await freePort({
      range,
      ephemeral: { low: 10_000, high: 60_999 },
      random: () => {
        throw new Error("no port of the range may be tried");
      },
    });
    expect(port).toBeGreaterThan(0);
    // Part of it is: only the part below.
    for (let i = 0; i < 20; i++) {
      const below = await freePort({ range, ephemeral: { low: 25_000, high: 60_999 } });
      expect(below).toBeGreaterThanOrEqual(20_000);
      expect(below).toBeLessThan(25_000);
    }
  });
});

describe("ephemeralRange", () => {
  const dir = mkdtempSync(path.join(tmpdir(), "llmgw-ports-"));
  const file = (text: string) => {
    const f = path.join(dir, `range-${Math.random()}`);
    writeFileSync(f, text);
    return f;
  };
  it("reads net.ipv4.ip_local_port_range", () => {
    expect(ephemeralRange(file("40000\t50000\n"))).toEqual({ low: 40_000, high: 50_000 });
  });
  it("falls back to Linux's default on a missing or nonsensical file", () => {
    const linux = { low: 32_768, high: 60_999 };
    expect(ephemeralRange(path.join(dir, "none"))).toEqual(linux);
    expect(ephemeralRange(file("garbage"))).toEqual(linux);
    expect(ephemeralRange(file("50000 40000"))).toEqual(linux);
    expect(ephemeralRange(file("0 70000"))).toEqual(linux);
  });
});
