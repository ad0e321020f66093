import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { initDataDir } from "../domain/tokens.js";
import { migrateStore } from "./migrate-store.js";

// What migrate-store refuses before it reaches any database; the copy itself runs against a
// real PostgreSQL in apps/cli/test/migrate-store.e2e.test.ts.
describe("migrateStore refuses a source it cannot copy", () => {
  const dirs: string[] = [];
  afterEach(() => {
    for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
  });
  const dir = () => {
    const d = mkdtempSync(join(tmpdir(), "llmgw-migrate-unit-"));
    dirs.push(d);
    return d;
  };
  // Nothing listens on port 1: reaching the database would fail differently.
  const toUrl = "postgres://llmgw@127.0.0.1:1/llmgw";

  it("a data dir without tokens: never started", async () => {
    const d = dir();
    await expect(migrateStore({ fromDataDir: d, toUrl })).rejects.toMatchObject({
      code: "LLMGW_CONTROL_PLANE_NOT_FOUND",
      message: expect.stringContaining(`no join token in ${d}`),
    });
  });

  it("a data dir with tokens but no state.db", async () => {
    const d = join(dir(), "cp");
    initDataDir(d);
    await expect(migrateStore({ fromDataDir: d, toUrl })).rejects.toMatchObject({
      code: "LLMGW_CONTROL_PLANE_NOT_FOUND",
      message: expect.stringContaining(`no SQLite store in ${d}`),
    });
  });
});
