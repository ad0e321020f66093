import { access, rename, rm, writeFile } from "node:fs/promises";
import path from "node:path";

/**
 * The file that says this agent last stopped by leaving the cluster (`SetLeaving` true): the
 * control plane still drains the node for it, and the next start asks it to stop
 * (`SetLeaving` false) before the node gets replicas again.
 */
export const LEAVING_MARKER_FILE = "leaving.json";

/** What the marker records, for an operator reading the state dir. */
export interface LeavingMarker {
  readonly nodeId: string;
  /** When the control plane took the leave, ms since the epoch. */
  readonly sinceUnixMs: number;
}

/** Writes the marker atomically (temp file + rename), owner-only, like the identity. */
export async function writeLeavingMarker(stateDir: string, marker: LeavingMarker): Promise<void> {
  const target = path.join(stateDir, LEAVING_MARKER_FILE);
  const tmp = `${target}.${process.pid}.tmp`;
  await writeFile(tmp, `${JSON.stringify(marker, null, 2)}\n`, { mode: 0o600 });
  await rename(tmp, target);
}

/**
 * Whether the marker is there. Its content is not read: a torn or hand-edited marker still
 * means "ask the control plane to end the leave", which is harmless when there is none.
 */
export async function hasLeavingMarker(stateDir: string): Promise<boolean> {
  try {
    await access(path.join(stateDir, LEAVING_MARKER_FILE));
    return true;
  } catch {
    return false;
  }
}

/** Removes the marker; one already gone is not an error. */
export async function removeLeavingMarker(stateDir: string): Promise<void> {
  await rm(path.join(stateDir, LEAVING_MARKER_FILE), { force: true });
}
