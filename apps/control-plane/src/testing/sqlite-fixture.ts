/**
 * A fresh SQLite store and manual clock for each test of a file, for the unit tests of the
 * cluster, its services and the routing publisher. Not in `index.ts`: it registers vitest
 * hooks, so only test files import it.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach } from "vitest";
import { openSqliteStore } from "../store/sqlite-store.js";
import type { ClusterStore } from "../store/types.js";
import { createManualClock, type ManualClock } from "./manual-clock.js";

/** What each test gets: the temp dir the store lives in, the store and a manual clock. */
export interface SqliteFixture {
  readonly dir: string;
  readonly store: ClusterStore;
  readonly clock: ManualClock;
}

/**
 * Before each test, opens a store in a new temp dir named `prefix…` and hands it to `use` with
 * a new manual clock; after each, closes the store and removes the dir.
 */
export function sqliteStoreEachTest(prefix: string, use: (fixture: SqliteFixture) => void): void {
  let current: SqliteFixture | undefined;
  beforeEach(() => {
    const dir = mkdtempSync(join(tmpdir(), prefix));
    current = {
      dir,
      store: openSqliteStore({ file: join(dir, "state.db") }),
      clock: createManualClock(),
    };
    use(current);
  });
  afterEach(() => {
    if (current === undefined) return;
    current.store.close();
    rmSync(current.dir, { recursive: true, force: true });
    current = undefined;
  });
}
