/**
 * Keeps README.md and docs/*.md honest: every `llmgw …` command their shell code blocks show
 * must exist in the built CLI (`llmgw <words> --help` exits 0), and every `--flag` shown with a
 * command must appear in that command's `--help` text. A failure names the file and line.
 *
 * The extraction is a small shell-lite reader, tested first against a table of snippets:
 * fenced blocks tagged sh/bash/shell/console/zsh or untagged (untagged blocks drawn with
 * box-drawing characters are diagrams and skipped), `$ ` prompts (a block with prompts has
 * only its prompt lines read, the rest is output), `\` continuations, comments, quotes,
 * pipelines and lists, `$(…)`/backtick substitutions, env assignments and wrappers
 * (`sudo -u u`, `env`, `exec`, `npx`, `pnpm exec`), and `node …/main.js` for `llmgw`.
 */
import { execFile, execFileSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { rmdir } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const run = promisify(execFile);
const cliRoot = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const repoRoot = resolve(cliRoot, "../..");

// ------------------------------------------------------------------ extraction

/** One `llmgw` invocation found in a document. */
interface Invocation {
  /** e.g. "README.md:42". */
  readonly where: string;
  /** The logical shell line it came from (continuations joined). */
  readonly text: string;
  /** Leading bare words after `llmgw` (command words, then positionals). */
  readonly words: readonly string[];
  /** `--flag` names shown with it (without `=value`). */
  readonly flags: readonly string[];
}

interface Token {
  readonly text: string;
  /** The token started inside quotes: never a flag, an assignment or a program name. */
  readonly quoted: boolean;
}

const SHELL_LANGS = new Set(["", "sh", "bash", "shell", "console", "zsh", "shell-session"]);
const BOX_DRAWING = /[\u2500-\u257f]/;

/** The shell code blocks of a Markdown text: `{ line: 1-based line of the first body line }`. */
function shellBlocks(markdown: string): { line: number; lines: string[] }[] {
  const blocks: { line: number; lines: string[] }[] = [];
  const lines = markdown.split("\n");
  let open: { fence: string; lang: string; line: number; lines: string[] } | undefined;
  for (const [i, raw] of lines.entries()) {
    const fence = /^\s*(`{3,}|~{3,})\s*([^\s`]*)/.exec(raw);
    if (open === undefined) {
      if (fence?.[1] !== undefined) {
        open = { fence: fence[1], lang: (fence[2] ?? "").toLowerCase(), line: i + 2, lines: [] };
      }
      continue;
    }
    if (fence?.[1]?.startsWith(open.fence) && fence[2] === "") {
      const diagram = open.lang === "" && open.lines.some((l) => BOX_DRAWING.test(l));
      if (SHELL_LANGS.has(open.lang) && !diagram)
        blocks.push({ line: open.line, lines: open.lines });
      open = undefined;
      continue;
    }
    open.lines.push(raw);
  }
  return blocks;
}

/** Logical shell lines of a block: prompts stripped (output dropped), continuations joined. */
function logicalLines(block: string[]): { offset: number; text: string }[] {
  const prompted = block.some((l) => /^\s*\$ /.test(l));
  const out: { offset: number; text: string }[] = [];
  let pending: { offset: number; text: string } | undefined;
  for (const [offset, raw] of block.entries()) {
    let line = raw;
    if (pending === undefined) {
      if (prompted) {
        const m = /^\s*\$ (.*)$/.exec(line);
        if (m === null) continue;
        line = m[1] ?? "";
      }
      pending = { offset, text: "" };
    }
    const continued = /(^|[^\\])\\$/.test(line);
    pending.text += continued ? `${line.slice(0, -1)} ` : line;
    if (!continued) {
      out.push(pending);
      pending = undefined;
    }
  }
  if (pending !== undefined) out.push(pending);
  return out;
}

/** Index just past the `)` that closes a `$(` whose body starts at `start`. */
function closingParen(line: string, start: number): number {
  let depth = 1;
  let quote: string | undefined;
  for (let i = start; i < line.length; i++) {
    const c = line[i];
    if (quote !== undefined) {
      if (c === "\\" && quote === '"') i++;
      else if (c === quote) quote = undefined;
    } else if (c === "'" || c === '"') quote = c;
    else if (c === "\\") i++;
    else if (c === "(") depth++;
    else if (c === ")" && --depth === 0) return i + 1;
  }
  return line.length + 1;
}

/**
 * Splits a shell line into simple commands (pipelines, lists, subshells and redirections end
 * one), each a list of tokens; the bodies of `$(…)` and backticks become commands of their own.
 */
function simpleCommands(line: string): Token[][] {
  const commands: Token[][] = [];
  let current: Token[] = [];
  let text = "";
  let quoted = false;
  let inToken = false;
  let quote: string | undefined;
  const endToken = (): void => {
    if (inToken) current.push({ text, quoted });
    text = "";
    quoted = false;
    inToken = false;
  };
  const endCommand = (): void => {
    endToken();
    if (current.length > 0) commands.push(current);
    current = [];
  };
  for (let i = 0; i < line.length; i++) {
    const c = line[i] as string;
    if (c === "$" && line[i + 1] === "(" && line[i + 2] !== "(" && quote !== "'") {
      const end = closingParen(line, i + 2);
      commands.push(...simpleCommands(line.slice(i + 2, end - 1)));
      if (!inToken) quoted = quote !== undefined;
      inToken = true;
      text += "$(…)";
      i = end - 1;
      continue;
    }
    if (c === "`" && quote !== "'") {
      const end = line.indexOf("`", i + 1);
      const stop = end < 0 ? line.length : end;
      commands.push(...simpleCommands(line.slice(i + 1, stop)));
      if (!inToken) quoted = quote !== undefined;
      inToken = true;
      text += "`…`";
      i = stop;
      continue;
    }
    if (quote !== undefined) {
      if (c === quote) quote = undefined;
      else if (c === "\\" && quote === '"' && i + 1 < line.length) text += line[++i];
      else text += c;
      continue;
    }
    if (c === "'" || c === '"') {
      if (!inToken) quoted = true;
      inToken = true;
      quote = c;
      continue;
    }
    if (c === "\\" && i + 1 < line.length) {
      inToken = true;
      text += line[++i];
      continue;
    }
    if (/\s/.test(c)) {
      endToken();
      continue;
    }
    if (c === "#" && !inToken) break;
    if ("|&;()<>".includes(c)) {
      endCommand();
      continue;
    }
    inToken = true;
    text += c;
  }
  endCommand();
  return commands;
}

const ASSIGNMENT = /^[A-Za-z_][A-Za-z0-9_]*=/;
/** sudo options that take a value. */
const SUDO_VALUED = new Set(["-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U"]);

/** Index of the first argument after `llmgw` in a simple command, or undefined. */
function llmgwArgsStart(tokens: readonly Token[]): number | undefined {
  let i = 0;
  const at = (k: number): Token | undefined => tokens[k];
  const skipAssignments = (): void => {
    while (at(i)?.quoted === false && ASSIGNMENT.test(at(i)?.text ?? "")) i++;
  };
  skipAssignments();
  for (;;) {
    const word = at(i);
    if (word === undefined || word.quoted) return undefined;
    const base = word.text.slice(word.text.lastIndexOf("/") + 1);
    if (base === "llmgw") return i + 1;
    if (base === "node" || base === "tsx") {
      const script = at(i + 1);
      return script !== undefined && /(^|\/)main\.[cm]?[jt]s$/.test(script.text)
        ? i + 2
        : undefined;
    }
    if (base === "sudo") {
      i++;
      while (at(i)?.text.startsWith("-") === true) {
        i += SUDO_VALUED.has(at(i)?.text ?? "") ? 2 : 1;
      }
      continue;
    }
    if (base === "env" || base === "npx" || base === "exec" || base === "nohup") {
      i++;
      while (at(i)?.text.startsWith("-") === true) i++;
      skipAssignments();
      continue;
    }
    if ((base === "pnpm" || base === "yarn") && at(i + 1)?.text === "exec") {
      i += 2;
      continue;
    }
    return undefined;
  }
}

/** Every `llmgw` invocation in a Markdown document's shell code blocks. */
function findInvocations(markdown: string, file: string): Invocation[] {
  const found: Invocation[] = [];
  for (const block of shellBlocks(markdown)) {
    for (const { offset, text } of logicalLines(block.lines)) {
      for (const tokens of simpleCommands(text)) {
        const start = llmgwArgsStart(tokens);
        if (start === undefined) continue;
        const args = tokens.slice(start);
        const words: string[] = [];
        for (const t of args) {
          if (t.quoted || !/^[a-z][a-z0-9-]*$/.test(t.text)) break;
          words.push(t.text);
        }
        const flags = args
          .filter((t) => !t.quoted)
          .map((t) => /^[[(]*(--[A-Za-z0-9][A-Za-z0-9-]*)/.exec(t.text)?.[1])
          .filter((f): f is string => f !== undefined);
        found.push({
          where: `${file}:${block.line + offset}`,
          text: text.trim(),
          words,
          flags: [...new Set(flags)],
        });
      }
    }
  }
  return found;
}

describe("finding llmgw invocations in Markdown", () => {
  const md = (lang: string, ...lines: string[]) =>
    ["# t", "", `\`\`\`${lang}`, ...lines, "```"].join("\n");
  const cases: [name: string, markdown: string, expected: [string, string[], string[]][]][] = [
    ["plain command", md("sh", "llmgw nodes --json"), [["t.md:4", ["nodes"], ["--json"]]]],
    [
      "words stop at the first non-word; values are not flags",
      md("bash", "llmgw deploy chat --model meta-llama/x --replicas=2 -f a.yaml"),
      [["t.md:4", ["deploy", "chat"], ["--model", "--replicas"]]],
    ],
    ["untagged block", md("", "llmgw status"), [["t.md:4", ["status"], []]]],
    ["other languages are ignored", md("yaml", "llmgw status"), []],
    ["untagged diagrams are ignored", md("", "┌──────┐", "llmgw control-plane", "└──────┘"), []],
    [
      "prompts: output lines are ignored",
      md("console", "$ llmgw keys list", "llmgw keys list --bogus is output", "$ echo hi"),
      [["t.md:4", ["keys", "list"], []]],
    ],
    [
      "env assignments, comments and continuations",
      md("sh", "LLMGW_ADMIN_TOKEN=x A=b llmgw drain gpu-07 \\", "  --json   # --not-a-flag"),
      [["t.md:4", ["drain", "gpu-07"], ["--json"]]],
    ],
    [
      "command substitution inside quotes, sudo with a user",
      md("sh", 'export T="$(sudo -u llmgw llmgw control-plane token --admin)"'),
      [["t.md:4", ["control-plane", "token"], ["--admin"]]],
    ],
    [
      "pipelines and lists",
      md("sh", "llmgw nodes --json | jq . && llmgw status; echo llmgw --nope"),
      [
        ["t.md:4", ["nodes"], ["--json"]],
        ["t.md:4", ["status"], []],
      ],
    ],
    [
      "quoted flags belong to another program",
      md("sh", "llmgw deploy x --extra-args '--max-num-seqs 8' --engine vllm"),
      [["t.md:4", ["deploy", "x"], ["--extra-args", "--engine"]]],
    ],
    [
      "wrappers and node …/main.js",
      md(
        "sh",
        "npx llmgw demo --no-llamacpp",
        "node apps/cli/dist/main.js version",
        "env X=1 /usr/bin/llmgw agent --state-dir d",
      ),
      [
        ["t.md:4", ["demo"], ["--no-llamacpp"]],
        ["t.md:5", ["version"], []],
        ["t.md:6", ["agent"], ["--state-dir"]],
      ],
    ],
    [
      "llmgw as an argument or in a path is not a command",
      md(
        "sh",
        "sudo install -m 0755 llmgw /usr/bin/llmgw",
        "systemctl restart llmgw-agent",
        "cat /etc/llmgw/agent.env",
      ),
      [],
    ],
    [
      "usage brackets",
      md("sh", "llmgw control-plane token [--admin]"),
      [["t.md:4", ["control-plane", "token"], ["--admin"]]],
    ],
  ];
  it.each(cases)("%s", (_name, markdown, expected) => {
    const got = findInvocations(markdown, "t.md").map((i) => [i.where, i.words, i.flags]);
    expect(got).toEqual(expected);
  });
});

// ------------------------------------------------------------------ the documents

const docFiles = [
  "README.md",
  ...(existsSync(join(repoRoot, "docs"))
    ? readdirSync(join(repoRoot, "docs"))
        .filter((f) => f.endsWith(".md"))
        .sort()
        .map((f) => `docs/${f}`)
    : []),
].filter((f) => existsSync(join(repoRoot, f)));

const invocations = docFiles.flatMap((f) =>
  findInvocations(readFileSync(join(repoRoot, f), "utf8"), f),
);

/** Flags `llmgw` itself takes before any command (see src/cli.ts). */
const TOP_LEVEL_FLAGS = ["--help", "--version"];

let mainJs = join(cliRoot, "dist", "main.js");
let privateOut: string | undefined;
/** Command key ("" for bare `llmgw`) → its --help text, or the failure. */
const helpOf = new Map<string, { code: number; text: string }>();
let commandNames: string[] = [];

function newestMtime(dir: string): number {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    newest = Math.max(newest, entry.isDirectory() ? newestMtime(path) : statSync(path).mtimeMs);
  }
  return newest;
}

async function cli(args: string[]): Promise<{ code: number; text: string }> {
  try {
    const { stdout, stderr } = await run(process.execPath, [mainJs, ...args], {
      cwd: repoRoot,
      env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "/tmp" },
      timeout: 60_000,
    });
    return { code: 0, text: stdout + stderr };
  } catch (error) {
    const e = error as { code?: number | string; stdout?: string; stderr?: string };
    return {
      code: typeof e.code === "number" ? e.code : -1,
      text: `${e.stdout ?? ""}${e.stderr ?? ""}${typeof e.code === "string" ? e.code : ""}`,
    };
  }
}

/** The longest registered command that prefixes `words` (as `llmgw` itself resolves it). */
function resolveKey(words: readonly string[]): string | undefined {
  for (let take = Math.min(words.length, 3); take > 0; take--) {
    const key = words.slice(0, take).join(" ");
    if (commandNames.includes(key)) return key;
  }
  return words.length === 0 ? "" : undefined;
}

/** A document with one unknown command and one unknown flag, to prove the checks can fail. */
const selfCheck = findInvocations(
  ["# self-check", "", "```sh", "llmgw nodez --json", "llmgw nodes --no-such-flag", "```"].join(
    "\n",
  ),
  "self-check.md",
);

/** One line per invocation whose command does not exist or whose `--help` fails. */
function commandProblems(invs: readonly Invocation[]): string[] {
  const problems: string[] = [];
  for (const inv of invs) {
    const key = resolveKey(inv.words);
    if (key === undefined) {
      const shown = `llmgw ${inv.words.join(" ")}`;
      problems.push(`${inv.where}: \`${inv.text}\`: no command "${shown}" in 'llmgw --help'`);
      continue;
    }
    const help = helpOf.get(key);
    if (help === undefined || help.code !== 0) {
      problems.push(
        `${inv.where}: \`${inv.text}\`: '${helpCommand(key)}' exited ${help?.code}: ${help?.text.trim()}`,
      );
    }
  }
  return problems;
}

/** One line per `--flag` shown with a command whose `--help` does not name it. */
function flagProblems(invs: readonly Invocation[]): string[] {
  const problems: string[] = [];
  for (const inv of invs) {
    const key = resolveKey(inv.words);
    const help = key === undefined ? undefined : helpOf.get(key);
    if (key === undefined || help === undefined || help.code !== 0) continue; // a command problem
    for (const flag of inv.flags) {
      if (flag === "--help" || (key === "" && TOP_LEVEL_FLAGS.includes(flag))) continue;
      const named = new RegExp(`(^|[^A-Za-z0-9-])${flag}(?![A-Za-z0-9-])`, "m");
      if (!named.test(help.text)) {
        problems.push(`${inv.where}: \`${inv.text}\`: ${flag} is not in '${helpCommand(key)}'`);
      }
    }
  }
  return problems;
}

function helpCommand(key: string): string {
  return key === "" ? "llmgw --help" : `llmgw ${key} --help`;
}

describe("README.md and docs/*.md show only commands and flags that exist", () => {
  beforeAll(async () => {
    if (!existsSync(mainJs)) {
      // As CI does: build the real bundle once.
      execFileSync("pnpm", ["--filter", "llmgw", "build"], { cwd: repoRoot, stdio: "ignore" });
    } else if (statSync(mainJs).mtimeMs < newestMtime(join(cliRoot, "src"))) {
      // A stale bundle would judge the docs against old help texts; build a private copy
      // rather than replacing the shared dist/ under someone else's running process.
      privateOut = join(cliRoot, "test", "dist", `readme-${process.pid}`);
      await run("npx", ["tsup", "--out-dir", privateOut, "--no-sourcemap"], {
        cwd: cliRoot,
        timeout: 120_000,
      });
      mainJs = join(privateOut, "main.js");
    }
    const top = await cli(["--help"]);
    expect(top.code, top.text).toBe(0);
    helpOf.set("", top);
    commandNames = [...top.text.matchAll(/^ {2}(\S.*?)\s*$/gm)].map((m) => m[1] as string);
    expect(commandNames.length).toBeGreaterThan(0);
    const keys = new Set<string>();
    for (const inv of [...invocations, ...selfCheck]) {
      const key = resolveKey(inv.words);
      if (key !== undefined && key !== "") keys.add(key);
    }
    // Two at a time: the machine is shared.
    const queue = [...keys];
    await Promise.all(
      [0, 1].map(async () => {
        for (let key = queue.shift(); key !== undefined; key = queue.shift()) {
          helpOf.set(key, await cli([...key.split(" "), "--help"]));
        }
      }),
    );
  }, 240_000);

  afterAll(async () => {
    if (privateOut === undefined) return;
    rmSync(privateOut, { recursive: true, force: true });
    await rmdir(dirname(privateOut)).catch(() => undefined); // only when no other build is in there
  });

  it("finds invocations to check (the extraction still works on these documents)", () => {
    expect(invocations.length).toBeGreaterThan(0);
  });

  it("reports a missing command or flag with the line that shows it (the check can fail)", () => {
    const problems = [...commandProblems(selfCheck), ...flagProblems(selfCheck)];
    expect(problems).toEqual([
      "self-check.md:4: `llmgw nodez --json`: no command \"llmgw nodez\" in 'llmgw --help'",
      "self-check.md:5: `llmgw nodes --no-such-flag`: --no-such-flag is not in 'llmgw nodes --help'",
    ]);
  });

  it.each(docFiles)("%s: every `llmgw <command>` exists (`--help` exits 0)", (file) => {
    const problems = commandProblems(invocations.filter((i) => i.where.startsWith(`${file}:`)));
    expect(problems, problems.join("\n")).toEqual([]);
  });

  it.each(docFiles)("%s: every `--flag` shown appears in its command's --help", (file) => {
    const problems = flagProblems(invocations.filter((i) => i.where.startsWith(`${file}:`)));
    expect(problems, problems.join("\n")).toEqual([]);
  });

  it("README.md: every `npm run <script>` shown exists in the root package.json", () => {
    const scripts = Object.keys(
      (
        JSON.parse(readFileSync(join(repoRoot, "package.json"), "utf8")) as {
          scripts?: Record<string, string>;
        }
      ).scripts ?? {},
    );
    const problems: string[] = [];
    const readme = readFileSync(join(repoRoot, "README.md"), "utf8");
    for (const block of shellBlocks(readme)) {
      for (const { offset, text } of logicalLines(block.lines)) {
        for (const tokens of simpleCommands(text)) {
          const [program, verb, script] = tokens.map((t) => t.text);
          if (program !== "npm") continue;
          const name = verb === "test" ? "test" : verb === "run" ? script : undefined;
          if (name !== undefined && !scripts.includes(name)) {
            problems.push(
              `README.md:${block.line + offset}: \`${text.trim()}\`: no script "${name}"`,
            );
          }
        }
      }
    }
    expect(problems, problems.join("\n")).toEqual([]);
  });
});

// ------------------------------------------------------------------ docs/api.md vs the code

/**
 * docs/api.md promises the complete list of router errors and RPC error codes. The tables that
 * define them are read as text (they are not part of any package's public API): every
 * `{ status, type, code }` in the router's http-errors.ts must appear on one line of api.md,
 * and every `LLMGW_CONTROL_PLANE_*: Code.X` mapping on a line that also names the Connect code.
 */
describe("docs/api.md lists every error the code can answer", () => {
  const api = existsSync(join(repoRoot, "docs", "api.md"))
    ? readFileSync(join(repoRoot, "docs", "api.md"), "utf8").split("\n")
    : [];
  const source = (path: string): string => readFileSync(join(repoRoot, path), "utf8");
  const httpErrors = [
    ...source("apps/router/src/http-errors.ts").matchAll(
      /\{\s*status:\s*(\d+),\s*type:\s*"([^"]+)",\s*code:\s*"([^"]+)"\s*\}/g,
    ),
  ].map((m) => ({ status: m[1] as string, type: m[2] as string, code: m[3] as string }));
  const connectCodes = [
    ...source("apps/control-plane/src/rpc/errors.ts").matchAll(
      /(LLMGW_CONTROL_PLANE_[A-Z_]+):\s*Code\.(\w+)/g,
    ),
  ].map((m) => ({
    code: m[1] as string,
    // Connect's wire name: InvalidArgument → invalid_argument.
    connect: (m[2] as string).replace(/(?<!^)([A-Z])/g, "_$1").toLowerCase(),
  }));

  it("found the tables in the code (the patterns still match it)", () => {
    expect(httpErrors.length).toBeGreaterThanOrEqual(10);
    expect(connectCodes.length).toBeGreaterThanOrEqual(5);
  });

  it("every router answer (status, error.type, error.code) has a line in docs/api.md", () => {
    const missing = httpErrors
      .filter(
        (e) =>
          !api.some(
            (l) =>
              new RegExp(`\\|\\s*${e.status}\\s*\\|`).test(l) &&
              l.includes(`\`${e.type}\``) &&
              l.includes(`\`${e.code}\``),
          ),
      )
      .map((e) => `${e.status} ${e.type} ${e.code}`);
    expect(missing, `docs/api.md does not list: ${missing.join("; ")}`).toEqual([]);
  });

  it("every LLMGW_CONTROL_PLANE_* code is listed with its Connect code", () => {
    const missing = connectCodes
      .filter(
        (e) => !api.some((l) => l.includes(`\`${e.code}\``) && l.includes(`\`${e.connect}\``)),
      )
      .map((e) => `${e.code} → ${e.connect}`);
    expect(missing, `docs/api.md does not list: ${missing.join("; ")}`).toEqual([]);
  });
});
