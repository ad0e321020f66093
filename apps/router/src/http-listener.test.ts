import { once } from "node:events";
import { type AddressInfo, connect, createServer, type Server, type Socket } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { createPerAddressCap } from "./http-listener.js";

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const fn of cleanups.splice(0).reverse()) fn();
});

/**
 * A real TCP server on loopback whose accepted connections go through `createPerAddressCap`,
 * each reported as coming from the next of `addresses`. A test cannot connect from several
 * addresses of one IPv6 /64 (loopback is `::1/128` alone; adding addresses would change the
 * host's network), so the address is the one thing stood in for; the sockets, their closing
 * and the cap are real.
 */
async function cappedServer(max: number, addresses: readonly string[]) {
  const admit = createPerAddressCap(max);
  const accepted: ((verdict: { letIn: boolean; held: Socket }) => void)[] = [];
  let next = 0;
  const server: Server = createServer((held) => {
    const remoteAddress = addresses[next++];
    const letIn = admit({
      remoteAddress,
      destroy: () => held.destroy(),
      once: (event, listener) => held.once(event, listener),
    });
    accepted.shift()?.({ letIn, held });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  cleanups.push(() => server.close());
  const port = (server.address() as AddressInfo).port;
  /** One connection, once the server took it: whether it was let in, and both ends. */
  const client = async (): Promise<{ letIn: boolean; socket: Socket; held: Socket }> => {
    const verdict = new Promise<{ letIn: boolean; held: Socket }>((r) => accepted.push(r));
    const socket = connect(port, "127.0.0.1");
    socket.on("error", () => {}); // a reset is one way of being closed
    cleanups.push(() => socket.destroy());
    const { letIn, held } = await verdict;
    // A connection over the cap is destroyed: the client sees it closed.
    if (!letIn) await once(socket, "close");
    return { letIn, socket, held };
  };
  return { client };
}

describe("the per-address connection cap", () => {
  it("counts the addresses of one IPv6 /64 as one client", async () => {
    const { client } = await cappedServer(2, [
      "2001:db8:1:2::a",
      "2001:db8:1:2::b",
      "2001:db8:1:2:ffff:ffff:ffff:ffff", // a third address of the same /64: over the cap
      "2001:db8:1:3::a", // another /64: its own cap
      "2001:db8:1:2::c", // once one of the first two closed
    ]);
    const first = await client();
    const second = await client();
    expect([first.letIn, second.letIn]).toEqual([true, true]);
    expect((await client()).letIn).toBe(false);
    expect((await client()).letIn).toBe(true);
    first.socket.destroy();
    await once(first.held, "close"); // a slot is freed once the server sees it close
    expect((await client()).letIn).toBe(true);
  });

  it("counts an IPv4-mapped address as its IPv4 address, and IPv4 per address", async () => {
    const { client } = await cappedServer(1, [
      "::ffff:192.0.2.1",
      "192.0.2.1", // the same client, unmapped: over the cap
      "::ffff:192.0.2.2", // its neighbour: its own cap
      "::1", // in ::/64 like every mapped address, and its own client
      "fe80::1%eth0",
      "fe80::2%eth0", // the same link's /64: over the cap
    ]);
    const letIn: boolean[] = [];
    for (let i = 0; i < 6; i++) letIn.push((await client()).letIn);
    expect(letIn).toEqual([true, false, true, true, true, false]);
  });
});
