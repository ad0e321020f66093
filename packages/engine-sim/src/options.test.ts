import { describe, expect, it } from "vitest";
import { parseEngineSimArgv, parseHostPort, resolveEngineSimOptions } from "./options.js";

describe("parseEngineSimArgv", () => {
  it("reads the flags the sim engine adapter emits", () => {
    const { options } = parseEngineSimArgv([
      "--model",
      "/models/llama",
      "--served-model-name",
      "llama",
      "--host",
      "0.0.0.0",
      "--port",
      "8001",
      "--max-model-len",
      "4096",
      "--mimic",
      "sglang",
      "--load-seconds",
      "2.5",
      "--seed",
      "9",
      "--nnodes",
      "2",
      "--node-rank",
      "1",
      "--dist-init-addr",
      "10.0.0.1:50000",
    ]);
    const r = resolveEngineSimOptions(options);
    expect(r).toMatchObject({
      model: "/models/llama",
      servedModelName: "llama",
      host: "0.0.0.0",
      port: 8001,
      maxModelLen: 4096,
      mimic: "sglang",
      loadMs: 2500,
      seed: 9,
      nnodes: 2,
      nodeRank: 1,
      distInitAddr: { host: "10.0.0.1", port: 50000 },
    });
  });

  it("reads timing and fault flags", () => {
    const r = resolveEngineSimOptions(
      parseEngineSimArgv([
        "--model",
        "m",
        "--time-scale",
        "50",
        "--prefill-tps",
        "20000",
        "--decode-step-ms",
        "8",
        "--max-num-seqs",
        "64",
        "--kv-cache-tokens",
        "100000",
        "--block-size",
        "32",
        "--fail-load",
        "--crash-after-requests",
        "3",
        "--hang-after-requests",
        "0",
        "--error-rate",
        "0.25",
        "--slow-token-ms",
        "5",
        "--die-mid-stream-after-tokens",
        "7",
      ]).options,
    );
    expect(r.timeScale).toBe(50);
    expect(r.timing).toMatchObject({
      prefillTokensPerSecond: 20000,
      decodeStepMs: 8,
      maxRunningSeqs: 64,
      kvCacheTokens: 100000,
      blockSizeTokens: 32,
      extraStepMs: 5,
    });
    expect(r.faults).toEqual({
      failLoad: true,
      crashAfterRequests: 3,
      hangAfterRequests: 0,
      errorRate: 0.25,
      slowTokenMs: 5,
      dieMidStreamAfterTokens: 7,
    });
  });

  it("defaults the served name to the model and turns faults off", () => {
    const r = resolveEngineSimOptions(parseEngineSimArgv(["--model", "m"]).options);
    expect(r).toMatchObject({
      servedModelName: "m",
      host: "127.0.0.1",
      port: 8000,
      maxModelLen: 8192,
      mimic: "vllm",
      timeScale: 1,
    });
    expect(r.faults).toEqual({
      failLoad: false,
      crashAfterRequests: null,
      hangAfterRequests: null,
      errorRate: 0,
      slowTokenMs: 0,
      dieMidStreamAfterTokens: null,
    });
  });

  it.each([
    [[], "--model is required"],
    [["--model", "m", "--bogus"], "Unknown option '--bogus'"],
    [["--model", "m", "--port", "eighty"], '--port expects a number, got "eighty"'],
    [["--model", "m", "--port", "70000"], "port must be an integer in [0, 65535], got 70000"],
    [["--model", "m", "--mimic", "trt"], '--mimic must be vllm or sglang, got "trt"'],
    [["--model", "m", "--nnodes", "2"], "distInitAddr is required when nnodes > 1"],
    [
      ["--model", "m", "--nnodes", "2", "--node-rank", "2", "--dist-init-addr", "h:1"],
      "nodeRank must be an integer in [0, 1], got 2",
    ],
    [
      ["--model", "m", "--nnodes", "2", "--dist-init-addr", "nohost"],
      'distInitAddr must be host:port, got "nohost"',
    ],
    [["--model", "m", "--error-rate", "2"], "errorRate must be a number in [0, 1], got 2"],
    [["--model", "m", "--time-scale", "0"], "timeScale must be > 0, got 0"],
    [
      ["--model", "m", "--max-model-len", "500000"],
      "maxModelLen (500000) is larger than the KV cache (400000 tokens)",
    ],
  ])("rejects %j with %s", (argv, message) => {
    expect(() => parseEngineSimArgv(argv)).toThrow(message);
  });

  it("returns help without requiring --model", () => {
    expect(parseEngineSimArgv(["--help"]).help).toBe(true);
  });
});

describe("parseHostPort", () => {
  it.each([
    ["sgl-dev-0:50000", { host: "sgl-dev-0", port: 50000 }],
    ["[fd00::1]:29500", { host: "fd00::1", port: 29500 }],
  ])("parses %s", (text, expected) => {
    expect(parseHostPort(text)).toEqual(expected);
  });
});
