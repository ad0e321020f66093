import { afterEach, describe, expect, it } from "vitest";
import { eventually, freePort, probe, type SimProcess, spawnSim } from "./helpers.js";

const started: SimProcess[] = [];
afterEach(() => {
  for (const p of started.splice(0)) p.kill();
});

function start(args: string[]): SimProcess {
  const p = spawnSim(args);
  started.push(p);
  return p;
}

async function group(): Promise<{ rank0: SimProcess; rank1: SimProcess; api: string }> {
  const [apiPort, distPort] = [await freePort(), await freePort()];
  const common = [
    "--model",
    "m",
    "--nnodes",
    "2",
    "--dist-init-addr",
    `127.0.0.1:${distPort}`,
    "--dist-timeout-seconds",
    "30",
  ];
  const rank0 = start([...common, "--node-rank", "0", "--port", String(apiPort)]);
  const api = `http://127.0.0.1:${apiPort}`;
  await rank0.waitFor(/rendezvous: listening/);
  // Rank 0 has loaded nothing it can serve until rank 1 joins: the port stays closed.
  await new Promise((r) => setTimeout(r, 300));
  expect(await probe(`${api}/health`)).toBe("refused");
  const rank1 = start([...common, "--node-rank", "1", "--port", "0"]);
  await rank0.waitFor(/rank 1 joined/);
  await eventually(async () => (await probe(`${api}/health`)) === 200);
  return { rank0, rank1, api };
}

describe("multi-node ranks like SGLang's --dist-init-addr", () => {
  it("keeps rank 0 unready until rank 1 joins, and fails rank 0 when rank 1 dies", async () => {
    const { rank0, rank1 } = await group();
    rank1.kill("SIGKILL");
    const exit = await rank0.exit;
    expect(exit.code).toBe(1);
    expect(rank0.output()).toMatch(
      /ERROR .*engine-sim failed: rank 1 of 2 disconnected from 127\.0\.0\.1:\d+/,
    );
  });

  it("ends rank 1 when rank 0 dies", async () => {
    const { rank0, rank1 } = await group();
    rank0.kill("SIGKILL");
    const exit = await rank1.exit;
    expect(exit.code).toBe(1);
    expect(rank1.output()).toMatch(
      /engine-sim failed: lost connection to rank 0 at 127\.0\.0\.1:\d+/,
    );
  });
});
