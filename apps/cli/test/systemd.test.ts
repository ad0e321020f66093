/**
 * The systemd units in deploy/systemd are what operators install, so they are checked like
 * code: `systemd-analyze verify` accepts them (with `/usr/bin/llmgw` pointed at a stub so
 * ExecStart resolves), both run as a dedicated user with a state directory and a restart
 * policy, the agent's stop signals only the agent (engines survive agent restarts and
 * upgrades), and every environment file a unit reads has an example that defines the
 * variables its ExecStart expands.
 */
import { execFile, execFileSync } from "node:child_process";
import {
  chmodSync,
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { basename, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";

const run = promisify(execFile);
const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
const unitDir = join(repoRoot, "deploy", "systemd");
const unitFiles = existsSync(unitDir)
  ? readdirSync(unitDir)
      .filter((f) => f.endsWith(".service"))
      .sort()
  : [];

/** A unit file as section → key → values (a key may repeat). */
type Unit = Map<string, Map<string, string[]>>;

/** Parses systemd's INI dialect: comments, sections, repeated keys, `\` continuations. */
function parseUnit(text: string): Unit {
  const unit: Unit = new Map();
  let section: Map<string, string[]> | undefined;
  let pending = "";
  for (const raw of text.split("\n")) {
    const line = pending + raw.trim();
    pending = "";
    if (line === "" || line.startsWith("#") || line.startsWith(";")) continue;
    if (line.endsWith("\\")) {
      pending = `${line.slice(0, -1)} `;
      continue;
    }
    const header = /^\[(.+)\]$/.exec(line);
    if (header?.[1] !== undefined) {
      section = unit.get(header[1]) ?? new Map();
      unit.set(header[1], section);
      continue;
    }
    const eq = line.indexOf("=");
    if (section === undefined || eq < 0) continue;
    const key = line.slice(0, eq).trim();
    section.set(key, [...(section.get(key) ?? []), line.slice(eq + 1).trim()]);
  }
  return unit;
}

/** The last value of `[section] key` (systemd's "last one wins" for single-valued keys). */
function value(unit: Unit, section: string, key: string): string | undefined {
  return unit.get(section)?.get(key)?.at(-1);
}

const units = new Map(
  unitFiles.map((f) => [f, parseUnit(readFileSync(join(unitDir, f), "utf8"))] as const),
);

function unitNamed(name: string): Unit {
  const unit = units.get(name);
  if (unit === undefined) throw new Error(`deploy/systemd/${name} is missing`);
  return unit;
}

/** Variables systemd itself sets for ExecStart (no env file needs to define them). */
const SYSTEMD_VARS = new Set([
  "STATE_DIRECTORY",
  "RUNTIME_DIRECTORY",
  "CACHE_DIRECTORY",
  "LOGS_DIRECTORY",
  "CONFIGURATION_DIRECTORY",
  "CREDENTIALS_DIRECTORY",
  "MAINPID",
  "USER",
  "HOME",
  "SHELL",
]);

/** `KEY=` lines of an env file. */
function envKeys(text: string): Set<string> {
  return new Set([...text.matchAll(/^\s*([A-Za-z_][A-Za-z0-9_]*)=/gm)].map((m) => m[1] as string));
}

describe("deploy/systemd units", () => {
  it("ships a unit for the control plane and one for the agent", () => {
    expect(unitFiles).toEqual(
      expect.arrayContaining(["llmgw-agent.service", "llmgw-control-plane.service"]),
    );
  });

  it.each(unitFiles)("%s runs as a dedicated unprivileged user", (file) => {
    const unit = unitNamed(file);
    const user = value(unit, "Service", "User");
    expect(value(unit, "Service", "DynamicUser") ?? "no", `${file}: DynamicUser`).toMatch(
      /^(no|false|0)$/,
    );
    expect(user, `${file}: User= is missing`).toBeDefined();
    expect(["root", "0", "nobody", "65534"], `${file}: User=${user}`).not.toContain(user);
  });

  it.each(unitFiles)("%s keeps its state in a StateDirectory= and passes it to llmgw", (file) => {
    const unit = unitNamed(file);
    const state = value(unit, "Service", "StateDirectory") ?? "";
    expect(state, `${file}: StateDirectory=`).toMatch(/^llmgw(\/[A-Za-z0-9._-]+)*$/);
    expect(value(unit, "Service", "ExecStart"), `${file}: ExecStart`).toMatch(
      /\$\{?STATE_DIRECTORY\}?/,
    );
  });

  it.each(unitFiles)("%s has a restart policy", (file) => {
    const unit = unitNamed(file);
    expect(value(unit, "Service", "Restart"), `${file}: Restart=`).toMatch(
      /^(always|on-failure|on-abnormal|on-abort|on-watchdog)$/,
    );
  });

  it("the agent's stop signals only the agent, so its engines survive a restart or upgrade", () => {
    expect(value(unitNamed("llmgw-agent.service"), "Service", "KillMode")).toBe("process");
  });

  it.each(unitFiles)(
    "%s: every EnvironmentFile= has an example in deploy/systemd defining what ExecStart expands",
    (file) => {
      const unit = unitNamed(file);
      const envFiles = unit.get("Service")?.get("EnvironmentFile") ?? [];
      expect(envFiles.length, `${file}: no EnvironmentFile=`).toBeGreaterThan(0);
      const defined = new Set<string>();
      for (const envFile of envFiles) {
        const example = join(unitDir, `${basename(envFile.replace(/^-/, ""))}.example`);
        expect(existsSync(example), `${file}: ${envFile} has no ${example}`).toBe(true);
        for (const key of envKeys(readFileSync(example, "utf8"))) defined.add(key);
      }
      const execStart = value(unit, "Service", "ExecStart") ?? "";
      const expanded = [...execStart.matchAll(/\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?/g)].map(
        (m) => m[1] as string,
      );
      const undefinedVars = expanded.filter((v) => !SYSTEMD_VARS.has(v) && !defined.has(v));
      expect(undefinedVars, `${file}: ExecStart expands variables no example defines`).toEqual([]);
    },
  );
});

/**
 * The `llmgw` command a unit's ExecStart runs and every `--flag` it passes, including those in
 * the `*_ARGS` variables it expands (their values and the comment lines just above them in the
 * env-file example, where operators look for what to put there).
 */
function execStartArgs(file: string): { words: string[]; flags: string[] } {
  const unit = unitNamed(file);
  const execStart = value(unit, "Service", "ExecStart") ?? "";
  const args = execStart.split(/\s+/).slice(1);
  const words: string[] = [];
  for (const a of args) {
    if (!/^[a-z][a-z0-9-]*$/.test(a)) break;
    words.push(a);
  }
  const texts = [execStart];
  const vars = new Set(
    [...execStart.matchAll(/\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?/g)].map((m) => m[1]),
  );
  for (const envFile of unit.get("Service")?.get("EnvironmentFile") ?? []) {
    const example = join(unitDir, `${basename(envFile.replace(/^-/, ""))}.example`);
    if (!existsSync(example)) continue;
    const lines = readFileSync(example, "utf8").split("\n");
    for (const [i, line] of lines.entries()) {
      const key = /^\s*([A-Za-z_][A-Za-z0-9_]*)=/.exec(line)?.[1];
      if (key === undefined || !vars.has(key)) continue;
      texts.push(line);
      for (let j = i - 1; j >= 0 && lines[j]?.trimStart().startsWith("#"); j--) {
        texts.push(lines[j] as string);
      }
    }
  }
  const flags = new Set(
    texts.flatMap((t) => [...t.matchAll(/(?<![\w-])--[a-z][a-z0-9-]*/g)].map((m) => m[0])),
  );
  return { words, flags: [...flags] };
}

describe("what the units run exists in the CLI", () => {
  const mainJs = join(repoRoot, "apps", "cli", "dist", "main.js");

  it.each(unitFiles)(
    "%s: ExecStart's command and flags are in its --help",
    async (file) => {
      if (!existsSync(mainJs)) {
        execFileSync("pnpm", ["--filter", "llmgw", "build"], { cwd: repoRoot, stdio: "ignore" });
      }
      const { words, flags } = execStartArgs(file);
      expect(words.length, `${file}: ExecStart runs no llmgw command`).toBeGreaterThan(0);
      const { stdout } = await run(process.execPath, [mainJs, ...words, "--help"], {
        timeout: 60_000,
      });
      const missing = flags.filter(
        (f) => !new RegExp(`(^|[^A-Za-z0-9-])${f}(?![A-Za-z0-9-])`, "m").test(stdout),
      );
      expect(missing, `${file}: not in 'llmgw ${words.join(" ")} --help'`).toEqual([]);
      expect(flags.length).toBeGreaterThan(0);
    },
    180_000,
  );
});

let hasSystemdAnalyze = false;
try {
  execFileSync("systemd-analyze", ["--version"], { stdio: "ignore" });
  hasSystemdAnalyze = true;
} catch {
  hasSystemdAnalyze = false;
}

describe.skipIf(!hasSystemdAnalyze)(
  hasSystemdAnalyze
    ? "systemd-analyze verify"
    : "systemd-analyze verify (skipped: systemd-analyze is not installed; apt-get install systemd)",
  () => {
    const dirs: string[] = [];
    afterAll(() => {
      for (const d of dirs) rmSync(d, { recursive: true, force: true });
    });

    /**
     * Copies units into a temp dir with /usr/bin/llmgw replaced by an executable stub, runs
     * `systemd-analyze verify`, and returns its exit code and the diagnostics about these units
     * (warnings such as "Unknown key" do not change the exit code, so they count too).
     */
    async function verify(
      files: Record<string, string>,
    ): Promise<{ code: number; problems: string[] }> {
      const dir = mkdtempSync(join(tmpdir(), "llmgw-systemd-"));
      dirs.push(dir);
      const stub = join(dir, "llmgw");
      writeFileSync(stub, "#!/bin/sh\nexit 0\n");
      chmodSync(stub, 0o755);
      const paths: string[] = [];
      for (const [name, text] of Object.entries(files)) {
        const path = join(dir, name);
        writeFileSync(path, text.replaceAll("/usr/bin/llmgw", stub));
        paths.push(path);
      }
      let code = 0;
      let output = "";
      try {
        const r = await run("systemd-analyze", ["verify", ...paths], { timeout: 60_000 });
        output = r.stdout + r.stderr;
      } catch (error) {
        const e = error as { code?: number; stdout?: string; stderr?: string };
        code = typeof e.code === "number" ? e.code : -1;
        output = `${e.stdout ?? ""}${e.stderr ?? ""}`;
      }
      const names = Object.keys(files);
      const problems = output
        .split("\n")
        .filter((l) => l.trim() !== "" && names.some((n) => l.includes(n)));
      return { code, problems };
    }

    it("accepts both units without a warning", async () => {
      const files = Object.fromEntries(
        unitFiles.map((f) => [f, readFileSync(join(unitDir, f), "utf8")]),
      );
      const result = await verify(files);
      expect(result.problems, result.problems.join("\n")).toEqual([]);
      expect(result.code).toBe(0);
    });

    it("reports a broken unit (the check can fail)", async () => {
      const agent = readFileSync(join(unitDir, "llmgw-agent.service"), "utf8");
      const broken = agent
        .replace("KillMode=process", "KillMode=procss")
        .replace("[Service]", "[Service]\nRestartt=always");
      const result = await verify({ "llmgw-broken.service": broken });
      expect(result.problems.join("\n")).toMatch(/kill mode/i);
      expect(result.problems.join("\n")).toMatch(/Restartt/);
    });
  },
);
