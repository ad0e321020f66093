import { chmodSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ROUTER_FLAGS } from "@llmgw/router-server";
import { afterAll, describe, expect, it } from "vitest";
import { runCli } from "../cli.js";
import type { CliIo } from "../command.js";

function capture(env: Record<string, string> = {}, signal = new AbortController().signal) {
  const out: string[] = [];
  const err: string[] = [];
  const io: CliIo = {
    stdout: { write: (c: string) => out.push(c) },
    stderr: { write: (c: string) => err.push(c) },
    env,
    cwd: process.cwd(),
    signal,
  };
  return { io, stdout: () => out.join(""), stderr: () => err.join("") };
}

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});
const tempDir = () => {
  const d = mkdtempSync(join(tmpdir(), "llmgw-router-cli-"));
  dirs.push(d);
  return d;
};

describe("llmgw router --help", () => {
  it("documents every flag the command takes", async () => {
    const c = capture();
    expect(await runCli(["router", "--help"], c.io)).toBe(0);
    const help = c.stdout();
    const missing = Object.keys(ROUTER_FLAGS).filter(
      (flag) => !new RegExp(`(^|\\s)--${flag}(?![\\w-])`, "m").test(help),
    );
    expect(missing).toEqual([]);
    expect(help).toMatch(/^Usage: llmgw router --control-plane URL/);
    expect(help).toContain("LLMGW_ROUTER_TOKEN");
  });

  it("is listed among the commands, with llmgw routers", async () => {
    const c = capture();
    await runCli(["--help"], c.io);
    expect(c.stdout()).toMatch(/^ {2}router\s*$/m);
    expect(c.stdout()).toMatch(/^ {2}routers\s*$/m);
  });
});

describe("llmgw router: refusals before anything starts", () => {
  it.each<[string, string[], Record<string, string>, string]>([
    [
      "no control plane",
      ["--router-token-file", "/nonexistent"],
      {},
      "--control-plane is required (or LLMGW_CONTROL_PLANE)",
    ],
    [
      "no token",
      ["--control-plane", "http://127.0.0.1:7070"],
      {},
      "--router-token-file FILE (or LLMGW_ROUTER_TOKEN, LLMGW_ROUTER_TOKEN_FILE) is required",
    ],
    [
      "a bad queue length",
      ["--control-plane", "http://127.0.0.1:7070", "--queue-length", "lots"],
      { LLMGW_ROUTER_TOKEN: "rt" },
      '--queue-length must be a whole number (got "lots")',
    ],
    [
      "an unreadable token file",
      ["--control-plane", "http://127.0.0.1:7070", "--router-token-file", "/nonexistent/rt"],
      {},
      "--router-token-file /nonexistent/rt: cannot read it: ENOENT",
    ],
    ["an unknown flag", ["--queue-lenght", "3"], {}, "Unknown option '--queue-lenght'"],
  ])("%s: exit 2 naming the flag", async (_name, argv, env, message) => {
    const c = capture({ ...env, LLMGW_STATE_DIR: tempDir() });
    expect(await runCli(["router", ...argv], c.io)).toBe(2);
    expect(c.stderr()).toContain(message);
    expect(c.stderr()).toContain("Run 'llmgw router --help' for usage.");
  });

  it("warns that --router-token is visible in ps, and never prints the token", async () => {
    const stateDir = tempDir();
    const controller = new AbortController();
    controller.abort(new Error("test over"));
    const c = capture({}, controller.signal);
    const code = await runCli(
      [
        "router",
        "--control-plane",
        "http://127.0.0.1:1",
        "--router-token",
        "rt-very-secret",
        "--state-dir",
        stateDir,
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "off",
      ],
      c.io,
    );
    expect(code).toBe(0);
    expect(c.stderr()).toContain("--router-token puts the secret on the command line");
    expect(c.stderr()).not.toContain("rt-very-secret");
    // It started, kept its id, stopped: the state dir is owner-only.
    expect(statSync(stateDir).mode & 0o777).toBe(0o700);
    expect(statSync(join(stateDir, "router-id")).mode & 0o777).toBe(0o600);
    expect(c.stderr()).toMatch(/INFO {2}router listening public=http:\/\/127\.0\.0\.1:\d+/);
    expect(c.stderr()).toMatch(/router stopped durationMs=\d+ forced=false/);
  });

  it("reads the token from a file and refuses one that holds more than a token", async () => {
    const dir = tempDir();
    const file = join(dir, "rt");
    writeFileSync(file, "two words\n");
    chmodSync(file, 0o600);
    const c = capture({ LLMGW_STATE_DIR: join(dir, "state") });
    expect(
      await runCli(
        ["router", "--control-plane", "http://127.0.0.1:1", "--router-token-file", file],
        c.io,
      ),
    ).toBe(2);
    expect(c.stderr()).toContain(`--router-token-file ${file} must hold one token on one line`);
    expect(c.stderr()).not.toContain("two words");
  });

  it("refuses an empty peer key file with the peer flag's own message", async () => {
    const dir = tempDir();
    const token = join(dir, "rt");
    writeFileSync(token, "rt-token-0123456789\n");
    const key = join(dir, "peer-key");
    writeFileSync(key, "  \n");
    chmodSync(key, 0o600);
    const c = capture({ LLMGW_STATE_DIR: join(dir, "state") });
    const args = ["router", "--control-plane", "http://127.0.0.1:1", "--router-token-file", token];
    expect(
      await runCli([...args, "--peer", "http://127.0.0.1:2", "--peer-key-file", key], c.io),
    ).toBe(2);
    expect(c.stderr()).toContain(
      `--peer-key-file ${key} must hold one key on one line (e.g. 'openssl rand -hex 32'`,
    );
  });
});
