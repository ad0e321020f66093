import { isControlPlaneError, readToken } from "@llmgw/control-plane/client";
import { type Command, parseCommandArgs } from "../command.js";

export const command: Command = {
  name: "control-plane token",
  summary: "print the join token (or --admin token) of a control plane",
  usage: `Usage: llmgw control-plane token [--admin] --data-dir DIR

Prints the token a control plane wrote into its data dir on first start: the join token
agents register with, or with --admin the token operators use (LLMGW_ADMIN_TOKEN).

Options:
  --admin          print the admin token instead of the join token
  --data-dir DIR   the control plane's data dir (env LLMGW_DATA_DIR, default /var/lib/llmgw/control-plane)
`,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, {
      admin: { type: "boolean" },
      "data-dir": { type: "string" },
    });
    const dir = values["data-dir"] ?? io.env.LLMGW_DATA_DIR ?? "/var/lib/llmgw/control-plane";
    try {
      io.stdout.write(`${readToken(dir, values.admin ? "admin" : "join")}\n`);
      return 0;
    } catch (error) {
      if (isControlPlaneError(error)) {
        io.stderr.write(`llmgw control-plane token: ${error.message}\n`);
        return 1;
      }
      const code = (error as { code?: string }).code;
      io.stderr.write(
        `llmgw control-plane token: cannot read the token in ${dir}: ${code ?? (error as Error).message}${code === "EACCES" ? " (run as the control plane's user)" : ""}\n`,
      );
      return 1;
    }
  },
};
