import { describe, expect, it } from "vitest";
import { schedulesByPriority } from "./scheduling-policy.js";

describe("schedulesByPriority", () => {
  it.each([
    ["vllm", ["--scheduling-policy", "priority"], true],
    ["vllm", ["--scheduling-policy=priority"], true],
    ["vllm", ["--scheduling_policy", "priority"], true],
    // argparse expands an unambiguous prefix: the engine schedules by priority.
    ["vllm", ["--scheduling-pol", "priority"], true],
    ["vllm", ["--scheduling=priority"], true],
    ["vllm", ["--scheduling-policy", "priority", "--scheduling", "fcfs"], false],
    ["vllm", ["--", "priority"], false],
    ["vllm", ["--enable-prefix-caching", "--scheduling-policy", "priority", "--seed", "1"], true],
    ["vllm", ["--scheduling-policy", "fcfs"], false],
    ["vllm", ["--scheduling-policy", "priority", "--scheduling-policy=fcfs"], false],
    ["vllm", ["--scheduling-policy=fcfs", "--scheduling-policy", "priority"], true],
    ["vllm", ["--scheduling-policy"], false],
    ["vllm", ["priority"], false],
    ["vllm", [], false],
    ["sglang", ["--scheduling-policy", "priority"], false],
    ["sim", ["--scheduling-policy=priority"], false],
  ] as const)("%s %j → %s", (engine, extraArgs, expected) => {
    expect(schedulesByPriority({ engine, extraArgs: [...extraArgs] })).toBe(expected);
  });
});
