import { describe, expect, it } from "vitest";
import { AgentError, isAgentError } from "./errors.js";

describe("AgentError", () => {
  it("carries its code, message and cause", () => {
    const cause = Object.assign(new Error("spawn vllm ENOENT"), { code: "ENOENT" });
    const error = new AgentError("LLMGW_AGENT_LAUNCH_FAILED", "launch failed: vllm not found", {
      cause,
    });
    expect(error).toBeInstanceOf(Error);
    expect(error.name).toBe("AgentError");
    expect(error.code).toBe("LLMGW_AGENT_LAUNCH_FAILED");
    expect(error.message).toBe("launch failed: vllm not found");
    expect(error.cause).toBe(cause);
    expect("cause" in new AgentError("LLMGW_AGENT_CONFIG_INVALID", "x")).toBe(false);
  });

  it.each([
    ["an AgentError", new AgentError("LLMGW_AGENT_STATE_DIR_UNSAFE", "x"), true],
    // What a second copy of this module makes: same Symbol.for brand, another class.
    ["a second copy's error", { [Symbol.for("llmgw.agent.error")]: true, code: "X" }, true],
    ["a plain Error", new Error("x"), false],
    ["another package's branded error", { [Symbol.for("llmgw.discovery.error")]: true }, false],
    ["null", null, false],
    ["a string", "LLMGW_AGENT_CONFIG_INVALID", false],
  ])("isAgentError(%s) is %s", (_name, value, expected) => {
    expect(isAgentError(value)).toBe(expected);
  });
});
