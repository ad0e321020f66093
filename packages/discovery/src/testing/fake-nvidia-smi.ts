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

/**
 * Writes a real executable (a Node script) named `nvidia-smi` into `dir` that answers by the
 * first matching rule (exit 0 and no output when none matches) and appends each argv, one
 * JSON line per call, to `<dir>/calls.jsonl`. Returns the executable's path.
 */
export async function writeFakeNvidiaSmi(
  dir: string,
  rules: readonly FakeNvidiaSmiRule[],
): Promise<string> {
  await mkdir(dir, { recursive: true });
  const path = join(dir, "nvidia-smi");
  const script = `#!${process.execPath}
const fs = require("node:fs");
const rules = ${JSON.stringify(rules)};
const argv = process.argv.slice(2);
fs.appendFileSync(${JSON.stringify(join(dir, "calls.jsonl"))}, JSON.stringify(argv) + "\\n");
const joined = argv.join(" ");
const rule = rules.find((r) => r.when.every((w) => joined.includes(w))) || {};
setTimeout(() => {
  if (rule.stdout) process.stdout.write(rule.stdout);
  if (rule.stderr) process.stderr.write(rule.stderr);
  process.exitCode = rule.exitCode || 0;
}, rule.sleepMs || 0);
`;
  await writeFile(path, script);
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
