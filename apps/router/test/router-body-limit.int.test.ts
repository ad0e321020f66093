/**
 * A client that keeps sending after its body went over the limit still reads the 413: the
 * router answers, stops reading what matters, and drains the rest for a bounded while before
 * closing, instead of resetting the connection under the client's feet.
 */
import { connect } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningRouter } from "../src/index.js";
import { routingSnapshot, startFedRouter } from "./routing-fixture.js";

let router: RunningRouter;

beforeAll(async () => {
  ({ router } = await startFedRouter({
    snapshot: routingSnapshot({ keys: { "sk-k": { id: "k", name: "k" } } }),
    router: { analyzer: { pool: false } }, // the default 8 MiB body limit
  }));
});

afterAll(async () => {
  await router?.close();
});

const BODY = new Uint8Array(64 * 1024 * 1024).fill(0x20);

async function expect413(init: RequestInit): Promise<void> {
  const response = await fetch(`${router.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: "Bearer sk-k", "content-type": "application/json" },
    ...init,
  });
  expect(response.status).toBe(413);
  expect(response.headers.get("connection")).toBe("close");
  expect(await response.json()).toEqual({
    error: {
      message: "request body exceeds the limit of 8388608 bytes",
      type: "invalid_request_error",
      code: "request_too_large",
      param: null,
    },
  });
}

describe("router: 413 for a client that keeps sending", () => {
  it("answers a declared 64 MiB body with the OpenAI error, not a reset", async () => {
    // Several times: a reset loses the answer only when it overtakes it (a third of the time
    // on loopback before the drain).
    for (let i = 0; i < 8; i++) await expect413({ body: BODY });
  });

  it("answers a chunked 64 MiB body (no length declared) the same way", async () => {
    const chunk = BODY.subarray(0, 1024 * 1024);
    for (let i = 0; i < 8; i++) {
      let sent = 0;
      const body = new ReadableStream<Uint8Array>({
        pull(controller) {
          if (sent >= 64) controller.close();
          else {
            sent++;
            controller.enqueue(chunk);
          }
        },
      });
      await expect413({ body, duplex: "half" } as RequestInit);
    }
  });
});

describe("router: Expect: 100-continue", () => {
  /** What the router sends back to `head` and then, if asked for, `body`, until it closes. */
  function exchange(head: string, body = ""): Promise<string> {
    return new Promise((resolve) => {
      const socket = connect(router.port, "127.0.0.1", () => socket.write(head));
      let got = "";
      socket.setEncoding("latin1");
      socket.on("data", (text: string) => {
        got += text;
        if (body !== "" && got.startsWith("HTTP/1.1 100 Continue\r\n\r\n")) {
          socket.write(body);
          body = "";
        }
      });
      socket.on("error", () => {});
      socket.on("close", () => resolve(got));
      setTimeout(() => socket.destroy(), 5_000);
    });
  }
  const head = (key: string, length: number) =>
    `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${key}\r\ncontent-type: application/json\r\ncontent-length: ${length}\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n`;

  it.each([
    ["a declared 1 GiB body", "sk-k", 1 << 30, 413],
    ["a request without a valid key", "nope", 8_000_000, 401],
  ])("refuses %s on its head, without inviting the body", async (_what, key, length, status) => {
    const started = performance.now();
    const got = await exchange(head(key, length));
    // Closed at once: no body is coming to drain.
    expect(performance.now() - started).toBeLessThan(2_000);
    expect(got).toMatch(new RegExp(`^HTTP/1\\.1 ${status} `));
    expect(got).not.toContain("100 Continue");
  });

  it("invites the body of a request it will read, then answers it", async () => {
    const body = JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] });
    const got = await exchange(head("sk-k", body.length), body);
    // Invited, read and answered (no model m here: its 404 proves the body was read).
    expect(got).toMatch(/^HTTP\/1\.1 100 Continue\r\n\r\nHTTP\/1\.1 404 /);
  });
});
