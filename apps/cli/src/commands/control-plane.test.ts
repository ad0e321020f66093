import { chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { UsageError } from "../command.js";
import { quietIo } from "../testing.js";
import { command, parseCount, parseDurationMs, storeUrl } from "./control-plane.js";

describe("control-plane flag values", () => {
  it.each([
    ["4096", 4096],
    [" 1 ", 1],
  ])("count %j → %d", (text, expected) => {
    expect(parseCount(text, "--max-connections")).toBe(expected);
  });

  it.each(["0", "-1", "1.5", "many", ""])("refuses count %j", (text) => {
    expect(() => parseCount(text, "--max-connections")).toThrow(
      `--max-connections must be a whole number of at least 1, got "${text}"`,
    );
  });

  it.each([
    ["1500ms", 1500],
    ["30s", 30_000],
    ["2", 2000],
  ])("duration %j → %d ms", (text, expected) => {
    expect(parseDurationMs(text, "--headers-timeout")).toBe(expected);
  });
});

describe("llmgw control-plane", () => {
  const roots: string[] = [];
  afterEach(() => {
    for (const r of roots.splice(0)) rmSync(r, { recursive: true, force: true });
  });

  /** Runs the command until its "ready" line, then stops it; returns that line and the exit. */
  async function runUntilReady(flags: string[]) {
    const root = mkdtempSync(join(tmpdir(), "llmgw-cp-cmd-"));
    roots.push(root);
    const stop = new AbortController();
    let err = "";
    let readyLine: ((line: string) => void) | undefined;
    const ready = new Promise<string>((resolve) => {
      readyLine = resolve;
    });
    const exit = command.run(
      ["--data-dir", root, "--listen", "127.0.0.1:0", "--control-listen", "127.0.0.1:0", ...flags],
      {
        ...quietIo(),
        signal: stop.signal,
        stderr: {
          write: (s: string) => {
            err += s;
            const line = err.split("\n").find((l) => / ready /.test(l));
            if (line) readyLine?.(line);
          },
        },
      },
    );
    const line = await Promise.race([ready, exit.then((code) => `exited ${code}: ${err}`)]);
    stop.abort(new Error("test done"));
    return { line, code: await exit };
  }

  it("serves /v1 by the in-process router by default", async () => {
    const { line, code } = await runUntilReady([]);
    const url = /public=(http:\/\/\S+)/.exec(line)?.[1];
    expect(url, line).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(line).toContain("routerToken=");
    expect(code).toBe(0);
  });

  it("starts no public listener with --no-public-api", async () => {
    const { line, code } = await runUntilReady(["--no-public-api"]);
    expect(line).toContain('public="off (--no-public-api)"');
    expect(code).toBe(0);
  });

  it("takes --agent-stream as a duration, 0 for none, and refuses one past half the request timeout", async () => {
    expect(command.usage).toContain("--agent-stream D");
    expect((await runUntilReady(["--agent-stream", "0"])).code).toBe(0);
    expect((await runUntilReady(["--agent-stream", "5s"])).code).toBe(0);
    await expect(
      runUntilReady(["--agent-stream", "20s", "--request-timeout", "30s"]),
    ).rejects.toThrow(
      /agentStreamMs: agentStreamMs must be 0 \(no streams\) or 1 s up to half of requestTimeoutMs \(got 20000\)/,
    );
    await expect(runUntilReady(["--agent-stream", "often"])).rejects.toThrow(
      /--agent-stream must be a duration/,
    );
  });

  it("takes --cache-isolation for its in-process router, never without API keys", async () => {
    expect(command.usage).toContain("--cache-isolation MODE");
    expect((await runUntilReady(["--cache-isolation", "tenant"])).code).toBe(0);
    await expect(runUntilReady(["--cache-isolation", "team"])).rejects.toThrow(
      '--cache-isolation must be one of none, tenant, key, got "team"',
    );
    await expect(runUntilReady(["--cache-isolation", "key", "--no-auth"])).rejects.toThrow(
      /--cache-isolation needs API keys/,
    );
  });

  it("takes --trusted-proxy, repeated or comma-separated, and refuses what is not an address or range", async () => {
    expect(command.usage).toContain("--trusted-proxy CIDR");
    expect(
      (await runUntilReady(["--trusted-proxy", "10.0.0.0/8,fd00::/8", "--trusted-proxy", "::1"]))
        .code,
    ).toBe(0);
    await expect(runUntilReady(["--trusted-proxy", "10.0.0.0/8,lb.internal"])).rejects.toThrow(
      '--trusted-proxy: "lb.internal" is not an IP address or CIDR range',
    );
  });

  it("documents --no-public-api and --routing-keepalive", () => {
    expect(command.usage).toContain("--no-public-api");
    expect(command.usage).toContain("--routing-keepalive D");
  });

  it("takes --routing-keepalive as a duration and refuses one out of range", async () => {
    expect((await runUntilReady(["--routing-keepalive", "500ms"])).code).toBe(0);
    await expect(runUntilReady(["--routing-keepalive", "50ms"])).rejects.toThrow(
      /routingKeepaliveMs: Too small: expected number to be >=100 \(got 50\)/,
    );
    await expect(runUntilReady(["--routing-keepalive", "soon"])).rejects.toThrow(
      /--routing-keepalive must be a duration/,
    );
  });
});

describe("the store URL (storeUrl)", () => {
  const dirs: string[] = [];
  afterEach(() => {
    for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
  });
  const file = (text: string) => {
    const dir = mkdtempSync(join(tmpdir(), "llmgw-store-url-"));
    dirs.push(dir);
    const f = join(dir, "url");
    writeFileSync(f, text, { mode: 0o600 });
    return f;
  };

  it("takes --store, then --store-url-file (trimmed), then LLMGW_STORE_URL", () => {
    expect(storeUrl("postgres://llmgw@db/llmgw", undefined, "postgres://env/x")).toBe(
      "postgres://llmgw@db/llmgw",
    );
    expect(storeUrl(undefined, file("postgres://u:secret@db/x\n"), undefined)).toBe(
      "postgres://u:secret@db/x",
    );
    expect(storeUrl(undefined, undefined, " postgres://env/x ")).toBe("postgres://env/x");
    expect(storeUrl(undefined, undefined, "")).toBeUndefined();
    expect(storeUrl("sqlite:", undefined, undefined)).toBe("sqlite:");
  });

  it.each([
    "postgres://llmgw:s3cret@db/llmgw",
    "postgresql://db/llmgw?user=llmgw&password=s3cret",
    // node-postgres decodes query keys: this one is its password too.
    "postgres://db/llmgw?pass%77ord=s3cret",
    "POSTGRES://llmgw:s3cret@db/llmgw",
  ])("refuses a password on the command line without echoing it: %s", (url) => {
    let message = "";
    try {
      storeUrl(url, undefined, undefined);
    } catch (error) {
      expect(error).toBeInstanceOf(UsageError);
      message = (error as Error).message;
    }
    expect(message).toContain("process list");
    expect(message).not.toContain("s3cret");
  });

  it("warns when --store-url-file holds a password and every local user may read it", () => {
    const warnings: string[] = [];
    const open = file("postgres://u:s3cret@db/x\n");
    chmodSync(open, 0o644);
    expect(storeUrl(undefined, open, undefined, (w) => warnings.push(w))).toBe(
      "postgres://u:s3cret@db/x",
    );
    expect(warnings).toEqual([
      `--store-url-file ${open} holds a password and every local user can read it (mode 644): chmod 600 it`,
    ]);
    expect(warnings.join()).not.toContain("s3cret");
    warnings.length = 0;
    storeUrl(undefined, file("postgres://u:s3cret@db/x\n"), undefined, (w) => warnings.push(w));
    const noPassword = file("postgres://u@db/x\n");
    chmodSync(noPassword, 0o644);
    storeUrl(undefined, noPassword, undefined, (w) => warnings.push(w));
    expect(warnings).toEqual([]);
  });

  it("refuses a postgres URL that does not parse, naming where it came from", () => {
    const broken = "postgres://[db/llmgw";
    expect(() => storeUrl(broken, undefined, undefined)).toThrow(
      new UsageError('--store must be "sqlite:" or a postgres:// URL'),
    );
    expect(() => storeUrl(undefined, file(broken), undefined)).toThrow(
      new UsageError('--store-url-file must be "sqlite:" or a postgres:// URL'),
    );
    const migrate = { flag: "--to", file: "--to-file" };
    expect(() => storeUrl(broken, undefined, undefined, () => {}, migrate)).toThrow(
      new UsageError('--to must be "sqlite:" or a postgres:// URL'),
    );
  });

  it("refuses both flags, an unreadable file and an empty one", () => {
    expect(() => storeUrl("sqlite:", file("x"), undefined)).toThrow(
      "give --store or --store-url-file, not both",
    );
    expect(() => storeUrl(undefined, "/nonexistent/url", undefined)).toThrow(
      /cannot read --store-url-file \/nonexistent\/url: ENOENT/,
    );
    const empty = file(" \n");
    expect(() => storeUrl(undefined, empty, undefined)).toThrow(
      `--store-url-file ${empty} is empty`,
    );
  });
});
