import { mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import {
  type PidRecord,
  pidFilePath,
  readPidFile,
  removePidFile,
  validateReplicaId,
  writePidFile,
} from "./pid-file.js";

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function stateDir(): string {
  const root = mkdtempSync(join(tmpdir(), "llmgw-pid-"));
  dirs.push(root);
  return join(root, "state");
}

const record: PidRecord = {
  version: 1,
  replicaId: "r-1",
  pid: 4242,
  pgid: 4242,
  startTime: "99",
  cmdlineSha256: "ab".repeat(32),
  specHash: "cd".repeat(32),
  logFile: "/tmp/x.log",
  writtenAtMs: 1,
};

describe("pid files", () => {
  it("round-trips with owner-only permissions", () => {
    const dir = stateDir();
    writePidFile(dir, record);
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    expect(statSync(pidFilePath(dir, "r-1")).mode & 0o777).toBe(0o600);
    expect(readPidFile(dir, "r-1")).toEqual({ kind: "ok", record });
    removePidFile(dir, "r-1");
    expect(readPidFile(dir, "r-1")).toEqual({ kind: "missing" });
  });

  it("keeps the launcher's stop settings, and reads files written without them", () => {
    const dir = stateDir();
    const withStop: PidRecord = { ...record, stopSignal: "SIGINT", stopGraceMs: 2500 };
    writePidFile(dir, withStop);
    expect(readPidFile(dir, "r-1")).toEqual({ kind: "ok", record: withStop });
    writePidFile(dir, record);
    expect(readPidFile(dir, "r-1")).toEqual({ kind: "ok", record });
  });

  it.each([
    ["not json", "not JSON"],
    [JSON.stringify({ ...record, pid: 1 }), "missing or malformed fields"],
    [JSON.stringify({ ...record, replicaId: "other" }), "missing or malformed fields"],
    [JSON.stringify({ ...record, startTime: 99 }), "missing or malformed fields"],
    [JSON.stringify({ ...record, stopGraceMs: -1 }), "missing or malformed fields"],
    [JSON.stringify({ ...record, stopSignal: "TERM; rm -rf" }), "missing or malformed fields"],
  ])("reports %s as invalid", (content, reason) => {
    const dir = stateDir();
    writePidFile(dir, record);
    writeFileSync(pidFilePath(dir, "r-1"), content);
    expect(readPidFile(dir, "r-1")).toEqual({ kind: "invalid", reason });
  });

  it.each(["../x", "", "a/b", ".hidden"])("rejects replica id %j", (id) => {
    expect(() => validateReplicaId(id)).toThrow(/^replica id must match/);
  });
});
