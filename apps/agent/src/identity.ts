import { mkdir, readFile, rename, writeFile } from "node:fs/promises";
import path from "node:path";

/** What the agent keeps across restarts: the node id and credential the control plane issued. */
export interface NodeIdentity {
  readonly nodeId: string;
  readonly credential: string;
  /** The control plane that issued it; a different URL means a different cluster. */
  readonly controlPlaneUrl: string;
}

const FILE = "identity.json";

/**
 * Reads the saved identity, or undefined when there is none or it is unreadable (a torn
 * write, a hand edit): the agent then registers again with its join token, which is safe.
 */
export async function loadIdentity(stateDir: string): Promise<NodeIdentity | undefined> {
  let text: string;
  try {
    text = await readFile(path.join(stateDir, FILE), "utf8");
  } catch {
    return undefined;
  }
  try {
    const parsed = JSON.parse(text) as Partial<NodeIdentity>;
    if (
      typeof parsed.nodeId === "string" &&
      typeof parsed.credential === "string" &&
      typeof parsed.controlPlaneUrl === "string"
    ) {
      return {
        nodeId: parsed.nodeId,
        credential: parsed.credential,
        controlPlaneUrl: parsed.controlPlaneUrl,
      };
    }
  } catch {
    // fall through: treated as absent
  }
  return undefined;
}

/** Writes the identity atomically (temp file + rename), owner-only. */
export async function saveIdentity(stateDir: string, identity: NodeIdentity): Promise<void> {
  await mkdir(stateDir, { recursive: true, mode: 0o700 });
  const target = path.join(stateDir, FILE);
  const tmp = `${target}.${process.pid}.tmp`;
  await writeFile(tmp, `${JSON.stringify(identity, null, 2)}\n`, { mode: 0o600 });
  await rename(tmp, target);
}
