import { describe, expect, it } from "vitest";
import { UsageError } from "../command.js";
import { quietIo } from "../testing.js";
import { command } from "./agent.js";

const io = quietIo();

describe("llmgw agent flags", () => {
  it.each([["mlx5_0"], ["=rail-0"], ["mlx5_0="]])(
    "refuses --fabric-name %j like 'agent inventory' does, before starting",
    async (pair) => {
      const run = command.run(
        ["--control-plane", "http://127.0.0.1:1", "--join-token", "t", "--fabric-name", pair],
        io,
      );
      await expect(run).rejects.toBeInstanceOf(UsageError);
      await expect(run).rejects.toThrow(/--fabric-name expects DEV=ID/);
    },
  );
});

/** An io that records stderr, with `env`. */
function recordingIo(env: Record<string, string> = {}) {
  const stderr: string[] = [];
  return {
    stderr,
    io: { ...quietIo(), env, stderr: { write: (chunk: string) => stderr.push(chunk) } },
  };
}

// A config error stops the command right after flag handling, before anything starts.
const BAD_ROOT = ["--model-root", "relative/dir"];
const TOKEN = "0123456789abcdef0123";

describe("llmgw agent --join-token", () => {
  it("warns on stderr that the token is visible on argv, and recommends LLMGW_JOIN_TOKEN", async () => {
    const { io, stderr } = recordingIo();
    const args = ["--control-plane", "http://127.0.0.1:1", "--join-token", TOKEN, ...BAD_ROOT];
    await expect(command.run(args, io)).rejects.toThrow(/modelRoot: must be an absolute path/);
    expect(stderr.join("")).toBe(
      "llmgw agent: warning: --join-token puts the secret on the command line, where every local user can read it (ps, /proc); set LLMGW_JOIN_TOKEN in the agent's environment file instead\n",
    );
  });

  it("warns when the control plane is plain HTTP on another host, and for no loopback or https URL", async () => {
    const warned = recordingIo({ LLMGW_JOIN_TOKEN: TOKEN });
    const remote = ["--control-plane", "https://cp-a:7070,http://10.0.0.5:7070", ...BAD_ROOT];
    await expect(command.run(remote, warned.io)).rejects.toThrow(/modelRoot/);
    expect(warned.stderr.join("")).toBe(
      "llmgw agent: warning: http://10.0.0.5:7070 is plain HTTP to another host: the join token and the node's credential cross the network unencrypted; serve the control plane with --tls-cert/--tls-key and use https://\n",
    );
    const quiet = recordingIo({ LLMGW_JOIN_TOKEN: TOKEN });
    const local = ["--control-plane", "http://localhost:7070,http://[::1]:7070", ...BAD_ROOT];
    await expect(command.run(local, quiet.io)).rejects.toThrow(/modelRoot/);
    expect(quiet.stderr).toEqual([]);
  });

  it("says nothing when the token comes from the environment", async () => {
    const { io, stderr } = recordingIo({ LLMGW_JOIN_TOKEN: TOKEN });
    const args = ["--control-plane", "http://127.0.0.1:1", ...BAD_ROOT];
    await expect(command.run(args, io)).rejects.toThrow(/modelRoot: must be an absolute path/);
    expect(stderr).toEqual([]);
  });
});

describe("llmgw agent --allow-engine-env", () => {
  it.each([
    [["--allow-engine-env", "PATH"], {}, "PATH cannot be allowed: it chooses which executables"],
    [["--allow-engine-env", "HF_ENDPOINT,LD_PRELOAD"], {}, "LD_PRELOAD cannot be allowed"],
    [[], { LLMGW_ALLOW_ENGINE_ENV: "NCCL_NET_PLUGIN" }, "NCCL_NET_PLUGIN cannot be allowed"],
    [["--allow-engine-env", "lower"], {}, "must be an environment variable name"],
  ])("refuses %j %j at start: %s", async (flags, env, message) => {
    const { io } = recordingIo({ LLMGW_JOIN_TOKEN: TOKEN, ...env });
    const run = command.run(["--control-plane", "http://127.0.0.1:1", ...flags], io);
    await expect(run).rejects.toBeInstanceOf(UsageError);
    await expect(run).rejects.toThrow(message);
  });
});

describe("llmgw agent --kernel-log", () => {
  it("is documented in the help text", () => {
    expect(command.usage).toContain("--kernel-log PATH");
    expect(command.usage).toContain('"off" disables it');
  });

  it("refuses an empty path before starting", async () => {
    const run = command.run(
      ["--control-plane", "http://127.0.0.1:1", "--join-token", TOKEN, "--kernel-log", ""],
      quietIo(),
    );
    await expect(run).rejects.toBeInstanceOf(UsageError);
    await expect(run).rejects.toThrow('kernelLog: must be a path or "off"');
  });
});

describe.each([
  [
    "--leave-timeout",
    "leaveTimeoutMs",
    "LLMGW_LEAVE_TIMEOUT",
    "(default 600; 0: no drain, stop at once;",
  ],
  [
    "--relaunch-failed",
    "relaunchFailedMs",
    "LLMGW_RELAUNCH_FAILED",
    "(default 60; env LLMGW_RELAUNCH_FAILED)",
  ],
] as const)("llmgw agent %s", (flag, field, envName, defaultText) => {
  it("is documented in the help text with its default and env", () => {
    expect(command.usage).toContain(`${flag} S`);
    expect(command.usage).toContain(defaultText);
    expect(command.usage).toContain(`env ${envName})`);
  });

  it.each([
    [[flag, "10m"], {}],
    [[flag, ""], {}],
    [[`${flag}=-1`], {}],
    [[flag, "86401"], {}],
    [[], { [envName]: "1e3" }],
  ])("refuses %j %j at start, naming the flag", async (flags, env) => {
    const { io } = recordingIo({ LLMGW_JOIN_TOKEN: TOKEN, ...env });
    const run = command.run(["--control-plane", "http://127.0.0.1:1", ...flags], io);
    await expect(run).rejects.toBeInstanceOf(UsageError);
    await expect(run).rejects.toThrow(`${field}: must be 0..86400 seconds (${flag})`);
  });
});
