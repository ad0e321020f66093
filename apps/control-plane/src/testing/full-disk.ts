import Database from "better-sqlite3";

const TABLES = [
  "replica_statuses",
  "deployments",
  "placements",
  "api_keys",
  "nodes",
  "events",
  "gpu_fault_clears",
] as const;
const OPS = ["INSERT", "UPDATE", "DELETE"] as const;

/**
 * Makes every write to the SQLite state store at `file` fail the way a full disk does, from
 * a second connection: triggers that abort each insert, update and delete with SQLite's own
 * "database or disk is full" text. Reads keep working. The store's open connection sees the
 * change at its next statement, as it would see a disk filling up. Returns the function
 * that frees the disk again.
 */
export function fillDisk(file: string): () => void {
  const db = new Database(file);
  try {
    for (const table of TABLES) {
      for (const op of OPS) {
        db.exec(
          `CREATE TRIGGER full_${table}_${op.toLowerCase()} BEFORE ${op} ON ${table}
           BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;`,
        );
      }
    }
  } finally {
    db.close();
  }
  return () => {
    const again = new Database(file);
    try {
      for (const table of TABLES)
        for (const op of OPS) again.exec(`DROP TRIGGER full_${table}_${op.toLowerCase()}`);
    } finally {
      again.close();
    }
  };
}
