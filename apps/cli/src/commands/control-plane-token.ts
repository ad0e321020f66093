import { isControlPlaneError, readToken } from "@llmgw/control-plane/client";
import { type Command, parseCommandArgs, UsageError } from "../command.js";

export const command: Command = {
  name: "control-plane token",
  summary: "print the join token (or --admin / --router token) of a control plane",
  usage: `Usage: llmgw control-plane token [--admin | --router] --data-dir DIR

Prints a token a control plane wrote into its data dir on its first start: the join token
agents register with, with --admin the token operators use (LLMGW_ADMIN_TOKEN), or with
--router the token 'llmgw router' watches the routing state with (LLMGW_ROUTER_TOKEN).

Options:
  --admin          print the admin token instead of the join token
  --router         print the router token (a data dir made before routers existed gets
                   one on the control plane's next start)
  --data-dir DIR   the control plane's data dir (env LLMGW_DATA_DIR, default /var/lib/llmgw/control-plane)
`,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, {
      admin: { type: "boolean" },
      router: { type: "boolean" },
      "data-dir": { type: "string" },
    });
    if (values.admin && values.router) {
      throw new UsageError("--admin and --router name different tokens: give one of them");
    }
    const kind = values.admin ? "admin" : values.router ? "router" : "join";
    const dir = values["data-dir"] ?? io.env.LLMGW_DATA_DIR ?? "/var/lib/llmgw/control-plane";
    try {
      io.stdout.write(`${readToken(dir, kind)}\n`);
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
