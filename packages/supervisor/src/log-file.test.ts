import { appendFileSync, mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { CappedLogFile } from "./log-file.js";

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function logPath(): string {
  const dir = mkdtempSync(join(tmpdir(), "llmgw-log-"));
  dirs.push(dir);
  return join(dir, "logs", "replica.log");
}

describe("CappedLogFile", () => {
  it("tails appended lines incrementally", () => {
    const path = logPath();
    const log = new CappedLogFile(path, { maxFileBytes: 1000, tailMaxLines: 3, tailMaxBytes: 100 });
    appendFileSync(path, "one\ntwo\n");
    log.poll();
    appendFileSync(path, "three\nfour\n");
    log.poll();
    expect(log.tail.lines()).toEqual(["two", "three", "four"]);
  });

  it("rotates to .1 keeping at most maxFileBytes and truncates the file", () => {
    const path = logPath();
    const log = new CappedLogFile(path, { maxFileBytes: 100, tailMaxLines: 5, tailMaxBytes: 200 });
    for (let i = 0; i < 30; i++) appendFileSync(path, `line ${String(i).padStart(2, "0")}\n`);
    log.poll();
    expect(statSync(path).size).toBe(0);
    const rotated = readFileSync(`${path}.1`, "utf8");
    expect(rotated.length).toBeGreaterThan(0);
    expect(rotated.length).toBeLessThanOrEqual(100);
    expect(rotated.endsWith("line 29\n")).toBe(true);
    expect(log.tail.lines().at(-1)).toBe("line 29");
    appendFileSync(path, "after\n");
    log.poll();
    expect(log.tail.lines().at(-1)).toBe("after");
  });

  it("prefills the tail from existing content when adopting", () => {
    const path = logPath();
    new CappedLogFile(path, { maxFileBytes: 1000, tailMaxLines: 5, tailMaxBytes: 100 });
    appendFileSync(path, "old 1\nold 2\n");
    const adopted = new CappedLogFile(
      path,
      { maxFileBytes: 1000, tailMaxLines: 5, tailMaxBytes: 100 },
      { prefillTail: true },
    );
    adopted.poll();
    expect(adopted.tail.lines()).toEqual(["old 1", "old 2"]);
  });
});
