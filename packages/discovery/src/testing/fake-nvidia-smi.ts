import { chmod, mkdir, symlink, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";

/** One canned answer of the fake nvidia-smi; the first rule whose `when` all match wins. */
export interface FakeNvidiaSmiRule {
  /** Substrings that must all occur in the space-joined argv; `[]` matches everything. */
  readonly when: readonly string[];
  readonly stdout?: string;
  readonly stderr?: string;
  readonly exitCode?: number;
  /** Sleep this long before answering (a hung driver: use more than the timeout). */
  readonly sleepMs?: number;
}

const quote = (text: string) => `'${text.replace(/'/g, "'\\''")}'`;

/**
 * Writes a real executable named `nvidia-smi` into `dir`: a POSIX sh script (starts in about a
 * millisecond, unlike a Node script) answering by the first matching rule — exit 0 and no
 * output when none matches — and appending its space-joined argv, one line per call, to
 * `<dir>/calls.log`. Outputs are stored byte-for-byte in files beside it and `cat`ed; a
 * sleeping rule `exec`s `sleep`, so a SIGKILL on timeout leaves no orphan behind.
 * Returns the executable's path.
 */
export async function writeFakeNvidiaSmi(
  dir: string,
  rules: readonly FakeNvidiaSmiRule[],
): Promise<string> {
  await mkdir(dir, { recursive: true });
  const path = join(dir, "nvidia-smi");
  const lines = [
    "#!/bin/sh",
    `printf '%s\\n' "$*" >> ${quote(join(dir, "calls.log"))}`,
    'args=" $* "',
    'has() { case "$args" in *"$1"*) return 0;; esac; return 1; }',
  ];
  for (const [i, rule] of rules.entries()) {
    const test =
      rule.when.length === 0 ? "true" : rule.when.map((w) => `has ${quote(w)}`).join(" && ");
    const body: string[] = [];
    if (rule.sleepMs) body.push(`  exec sleep ${(rule.sleepMs / 1000).toFixed(3)}`);
    if (rule.stdout !== undefined) {
      await writeFile(join(dir, `rule-${i}.stdout`), rule.stdout);
      body.push(`  cat ${quote(join(dir, `rule-${i}.stdout`))}`);
    }
    if (rule.stderr !== undefined) {
      await writeFile(join(dir, `rule-${i}.stderr`), rule.stderr);
      body.push(`  cat ${quote(join(dir, `rule-${i}.stderr`))} >&2`);
    }
    body.push(`  exit ${rule.exitCode ?? 0}`);
    lines.push(`if ${test}; then`, ...body, "fi");
  }
  lines.push("exit 0", "");
  await writeFile(path, lines.join("\n"));
  await chmod(path, 0o755);
  return path;
}

/** A file (text), a directory (`{ dir: true }`) or a symlink (`{ link: target }`). */
export type TreeEntry = string | { readonly dir: true } | { readonly link: string };

/**
 * Writes a file tree under `root` from relative paths, e.g. a fake `/sys/class/infiniband`.
 * A directory where sysfs has a file makes reads fail (EISDIR), standing in for EINVAL.
 */
export async function writeTree(
  root: string,
  entries: Readonly<Record<string, TreeEntry>>,
): Promise<void> {
  for (const [relative, entry] of Object.entries(entries)) {
    const path = join(root, relative);
    if (typeof entry === "string") {
      await mkdir(dirname(path), { recursive: true });
      await writeFile(path, entry);
    } else if ("dir" in entry) {
      await mkdir(path, { recursive: true });
    } else {
      await mkdir(dirname(path), { recursive: true });
      await symlink(entry.link, path);
    }
  }
}

/**
 * Drops the `#` comment lines a fixture file starts with (where its source is cited), leaving
 * the tool output byte-for-byte.
 */
export function stripFixtureComments(text: string): string {
  const lines = text.split("\n");
  let start = 0;
  while (start < lines.length && lines[start]?.startsWith("#")) start++;
  return lines.slice(start).join("\n");
}
