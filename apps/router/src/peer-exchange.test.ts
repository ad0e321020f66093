import { describe, expect, it } from "vitest";
import { MAX_PEER_LINE_BYTES, parsePeerEvent, startPeerExchange } from "./peer-exchange.js";

describe("parsePeerEvent", () => {
  it("reads the three events, a 48-bit chain and a 32-bit hint", () => {
    expect(
      parsePeerEvent(
        '{"t":"sent","model":"m","replica":"r1","prefill":1200,"hint":4294967295,"home":true,"chain":[0,281474976710655],"tail":281474976710655}',
      ),
    ).toEqual({
      t: "sent",
      model: "m",
      replicaId: "r1",
      prefillTokens: 1200,
      hint: 4294967295,
      home: true,
      chain: new Float64Array([0, 2 ** 48 - 1]),
      tail: 2 ** 48 - 1,
    });
    expect(parsePeerEvent('{"t":"sent","model":"m","replica":"r1","prefill":0}')).toEqual({
      t: "sent",
      model: "m",
      replicaId: "r1",
      prefillTokens: 0,
    });
    expect(parsePeerEvent('{"t":"first","replica":"r1","prefill":7}')).toEqual({
      t: "first",
      replicaId: "r1",
      prefillTokens: 7,
    });
    expect(parsePeerEvent('{"t":"end","replica":"r1","extra":1}')).toEqual({
      t: "end",
      replicaId: "r1",
    });
    expect(parsePeerEvent('{"t":"inflight","replicas":{"r1":3,"r2":0}}')).toEqual({
      t: "inflight",
      replicas: new Map([
        ["r1", 3],
        ["r2", 0],
      ]),
    });
    // A type a newer router sends is skipped, not refused.
    expect(parsePeerEvent('{"t":"claim","replica":"r1"}')).toBeUndefined();
  });

  it.each([
    ["not json", "not JSON"],
    ["[1]", "not a JSON object"],
    ['{"t":"end"}', '"replica" must be a string of 1–256 characters'],
    [
      `{"t":"end","replica":"${"r".repeat(257)}"}`,
      '"replica" must be a string of 1–256 characters',
    ],
    [
      '{"t":"first","replica":"r","prefill":1.5}',
      '"prefill" must be a whole number of tokens in 0–10000000',
    ],
    [
      '{"t":"sent","replica":"r","prefill":10000001}',
      '"prefill" must be a whole number of tokens in 0–10000000',
    ],
    ['{"replica":"r","prefill":1}', '"t" must name the event, e.g. "sent"'],
    ['{"t":"inflight","replicas":[1]}', '"replicas" must be an object of replica ids to counts'],
    [
      '{"t":"inflight","replicas":{"r1":-1}}',
      '"replicas"."r1" must be a whole number in 0–1000000',
    ],
    [
      '{"t":"inflight","replicas":{"":1}}',
      '"replicas" keys must be replica ids of 1–256 characters',
    ],
    ['{"t":"sent","replica":"r","prefill":1}', '"model" must be a string of 1–256 characters'],
    [
      '{"t":"sent","model":"m","replica":"r","prefill":1,"hint":-1,"home":true}',
      '"hint" must be a 32-bit unsigned integer',
    ],
    [
      '{"t":"sent","model":"m","replica":"r","prefill":1,"hint":4294967296,"home":true}',
      '"hint" must be a 32-bit unsigned integer',
    ],
    [
      '{"t":"sent","model":"m","replica":"r","prefill":1,"hint":5}',
      '"home" must be true or false with a "hint"',
    ],
    [
      '{"t":"sent","model":"m","replica":"r","prefill":1,"chain":{}}',
      '"chain" must be an array of at most 4096 block keys',
    ],
    [
      `{"t":"sent","model":"m","replica":"r","prefill":1,"chain":[${"1,".repeat(4096)}1]}`,
      '"chain" must be an array of at most 4096 block keys',
    ],
    [
      '{"t":"sent","model":"m","replica":"r","prefill":1,"chain":[1,281474976710656]}',
      '"chain"[1] must be a 48-bit block key',
    ],
    [
      '{"t":"sent","model":"m","replica":"r","prefill":1,"chain":[1,"2"]}',
      '"chain"[1] must be a 48-bit block key',
    ],
    [
      '{"t":"sent","model":"m","replica":"r","prefill":1,"tail":281474976710656}',
      '"tail" must be a 48-bit block key',
    ],
    [
      '{"t":"sent","model":"m","replica":"r","prefill":1,"tail":"7"}',
      '"tail" must be a 48-bit block key',
    ],
  ])("refuses %s: %s", (line, reason) => {
    expect(parsePeerEvent(line)).toBe(reason);
  });

  it("refuses an in-flight event naming more replicas than the bound", () => {
    const replicas = (n: number) =>
      JSON.stringify({
        t: "inflight",
        replicas: Object.fromEntries(Array.from({ length: n }, (_, i) => [`r${i}`, 1])),
      });
    expect(parsePeerEvent(replicas(4097))).toBe('"replicas" must name at most 4096 replicas');
    expect(
      (parsePeerEvent(replicas(4096)) as { replicas: ReadonlyMap<string, number> }).replicas.size,
    ).toBe(4096);
  });

  it("refuses a line over the limit before parsing it", () => {
    expect(parsePeerEvent(" ".repeat(MAX_PEER_LINE_BYTES + 1))).toBe(
      `an event longer than ${MAX_PEER_LINE_BYTES} bytes`,
    );
  });
});

describe("startPeerExchange", () => {
  const ok = { routerId: "r-a", peers: [], key: "0123456789abcdef", apply() {}, gone() {} };
  it.each([
    [{ routerId: "a b" }, 'the router id must be 1–119 of A-Z a-z 0-9 . _ : -, got "a b"'],
    [{ key: "short" }, "the peer key must be at least 16 characters"],
    [{ peers: ["10.0.0.1:8080"] }, 'a peer must be an http(s) URL, got "10.0.0.1:8080"'],
    [{ peers: ["ftp://r2"] }, 'a peer must be an http(s) URL, got "ftp://r2"'],
  ])("refuses %j", (bad, message) => {
    expect(() => startPeerExchange({ ...ok, ...bad })).toThrow(`peer exchange: ${message}`);
  });
});
