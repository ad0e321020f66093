import { connect, createServer, type Socket } from "node:net";

/**
 * A loopback TCP proxy in front of one port, for partitioning one client from a server
 * (a control plane from PostgreSQL) while others still reach it. `cut()` is a silent
 * partition, as a dead switch port is: nothing is closed, bytes stop flowing both ways and
 * new connections are accepted but never answered. `restore()` drops what the cut held (its
 * clients see the connections die and reconnect) and forwards again. `strand()` silences only
 the connections open now, as a peer that vanished without a reset does, and forwards new ones.
 */
export interface TcpProxy {
  readonly port: number;
  cut(): void;
  strand(): void;
  restore(): void;
  close(): Promise<void>;
}

export async function startTcpProxy(targetPort: number, host = "127.0.0.1"): Promise<TcpProxy> {
  let cutOff = false;
  const pairs = new Set<{ client: Socket; upstream: Socket | undefined }>();
  const server = createServer((client) => {
    const pair: { client: Socket; upstream: Socket | undefined } = { client, upstream: undefined };
    pairs.add(pair);
    const end = () => {
      client.destroy();
      pair.upstream?.destroy();
      pairs.delete(pair);
    };
    client.on("error", end);
    client.on("close", end);
    if (cutOff) {
      client.pause();
      return;
    }
    const upstream = connect(targetPort, host);
    pair.upstream = upstream;
    upstream.on("error", end);
    upstream.on("close", end);
    client.pipe(upstream);
    upstream.pipe(client);
  });
  const silence = () => {
    for (const { client, upstream } of pairs) {
      client.unpipe();
      upstream?.unpipe();
      client.pause();
      upstream?.pause();
    }
  };
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as { port: number }).port;
  return {
    port,
    cut() {
      cutOff = true;
      silence();
    },
    strand() {
      silence();
    },
    restore() {
      cutOff = false;
      for (const { client, upstream } of [...pairs]) {
        client.destroy();
        upstream?.destroy();
      }
      pairs.clear();
    },
    async close() {
      for (const { client, upstream } of pairs) {
        client.destroy();
        upstream?.destroy();
      }
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
