import { accessSync, constants, statSync } from "node:fs";
import path from "node:path";
import { SupervisorError } from "./errors.js";

/**
 * Resolves a bare `argv[0]` (no `/`) to an absolute path through `searchPath`, a PATH-style
 * list, the way execvp would. A name with a `/` is returned as is. Throws
 * `LLMGW_SUPERVISOR_SPAWN_FAILED` naming the directories searched when nothing matches.
 *
 * Why not let spawn do it: spawn looks the name up through the CHILD's environment, so
 * whoever shapes that environment (a deployment's `env`) would choose the program.
 */
export function resolveExecutable(command: string, searchPath: string): string {
  if (command.includes("/")) return command;
  const dirs = searchPath.split(":").filter((dir) => path.isAbsolute(dir));
  for (const dir of dirs) {
    const candidate = path.join(dir, command);
    try {
      if (!statSync(candidate).isFile()) continue;
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here, or not executable: keep looking, as execvp does
    }
  }
  throw new SupervisorError(
    "LLMGW_SUPERVISOR_SPAWN_FAILED",
    `cannot find executable ${JSON.stringify(command)} on the supervisor's search path (${dirs.join(":") || "empty"})`,
  );
}
