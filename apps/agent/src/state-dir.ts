import { chmod, lstat, mkdir } from "node:fs/promises";
import path from "node:path";
import { AgentError } from "./errors.js";

/** Subdirectories of the agent's state dir that hold pid files, replica records and logs. */
export const STATE_SUBDIRS = ["pids", "replicas", "logs"] as const;

/**
 * Creates the agent's state dir and its subdirectories, and tightens any that already exist
 * to 0700. A state dir (or its `logs/`) left 0777 by hand lets any local user plant a symlink
 * that the agent — often root — would append engine output to, or read a replica record or
 * key from. A symlink in place of one of these directories, or one owned by another user, is
 * refused: chmod would follow the link, and the other owner could loosen it again.
 *
 * @param uid the agent's user id (`process.getuid()`); undefined skips the owner check.
 * @throws AgentError `LLMGW_AGENT_STATE_DIR_UNSAFE` naming the directory and what is wrong.
 */
export async function prepareStateDir(stateDir: string, uid: number | undefined): Promise<void> {
  await mkdir(stateDir, { recursive: true, mode: 0o700 });
  for (const dir of [stateDir, ...STATE_SUBDIRS.map((d) => path.join(stateDir, d))]) {
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const stat = await lstat(dir);
    if (!stat.isDirectory()) {
      throw new AgentError(
        "LLMGW_AGENT_STATE_DIR_UNSAFE",
        `state directory ${dir} is ${stat.isSymbolicLink() ? "a symbolic link" : "not a directory"}; refusing to use it`,
      );
    }
    if (uid !== undefined && stat.uid !== uid) {
      throw new AgentError(
        "LLMGW_AGENT_STATE_DIR_UNSAFE",
        `state directory ${dir} is owned by uid ${stat.uid}, not the agent's uid ${uid}; refusing to use it`,
      );
    }
    if ((stat.mode & 0o777) !== 0o700) await chmod(dir, 0o700);
  }
}
