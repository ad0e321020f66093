import { describe, expect, it } from "vitest";
import {
  parseEngineSimArgv,
  parseHostPort,
  parseKvEventsConfig,
  resolveEngineSimOptions,
  resolveKvEventsOptions,
} from "./options.js";

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
      "--enable-prompt-tokens-details",
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
      enablePromptTokensDetails: true,
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

describe("KV events options", () => {
  it("reads vLLM's --kv-events-config JSON and the encoding flag", () => {
    const { options } = parseEngineSimArgv([
      "--model",
      "m",
      "--kv-events-config",
      '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv@10.0.0.1:8000@m","buffer_steps":50,"hwm":100000}',
      "--kv-events-encoding",
      "positional",
    ]);
    expect(resolveEngineSimOptions(options).kvEvents).toEqual({
      endpoint: "tcp://*:5557",
      replayEndpoint: "tcp://*:5558",
      topic: "kv@10.0.0.1:8000@m",
      bufferSteps: 50,
      encoding: "positional",
    });
  });

  it.each([
    [undefined, undefined],
    [{}, undefined],
    [{ enableKvCacheEvents: false, endpoint: "tcp://*:1" }, undefined],
    [{ enableKvCacheEvents: true, publisher: "null" as const }, undefined],
    [
      { enableKvCacheEvents: true },
      {
        endpoint: "tcp://*:5557",
        replayEndpoint: undefined,
        topic: "",
        bufferSteps: 10_000,
        encoding: "tagged",
      },
    ],
  ])("resolves %j to vLLM's defaults", (input, expected) => {
    expect(resolveKvEventsOptions(input)).toEqual(expected);
  });

  it.each([
    ["not json", "Unexpected token"],
    ["[]", '--kv-events-config must be a JSON object, got "[]"'],
    ['{"enable":true}', '--kv-events-config has an unknown key "enable"'],
    [
      '{"enable_kv_cache_events":"yes"}',
      '--kv-events-config enable_kv_cache_events must be a boolean, got "yes"',
    ],
  ])("refuses --kv-events-config %s", (text, message) => {
    expect(() => parseKvEventsConfig(text)).toThrow(message);
  });

  it.each([
    [{ publisher: "kafka" }, 'kvEvents.publisher must be "zmq" or "null", got "kafka"'],
    [{ encoding: "json" }, 'kvEvents.encoding must be "tagged" or "positional", got "json"'],
    [
      { endpoint: "localhost:5557" },
      'kvEvents.endpoint must be a tcp://, ipc:// or inproc:// endpoint, got "localhost:5557"',
    ],
    [
      { bufferSteps: -1 },
      "kvEvents.bufferSteps must be an integer in [0, 9007199254740991], got -1",
    ],
  ])("refuses %j", (extra, message) => {
    expect(() =>
      resolveKvEventsOptions({ enableKvCacheEvents: true, ...(extra as object) }),
    ).toThrow(expect.objectContaining({ code: "LLMGW_ENGINE_SIM_INVALID_OPTION", message }));
  });
});
