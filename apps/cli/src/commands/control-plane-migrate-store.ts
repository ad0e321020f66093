import { isControlPlaneError, migrateStore, STORE_TABLES } from "@llmgw/control-plane";
import { type Command, parseCommandArgs, UsageError } from "../command.js";
import { storeUrl } from "./control-plane.js";

export const command: Command = {
  name: "control-plane migrate-store",
  summary: "copy a control plane's SQLite store into PostgreSQL, and check the copy",
  usage: `Usage: llmgw control-plane migrate-store --from sqlite:DIR (--to-file FILE | --to URL) [--force]

Copies every deployment, placement, node record, API key (hashes only), GPU fault clear,
replica status and event from the SQLite store in DIR into a PostgreSQL database, in one
transaction, and commits only once the copy, read back, matches the source table by table
(row counts and a sha256 of every record). The source is read from an online backup and
never changed. The target belongs to DIR's tokens afterwards: start each control-plane
instance with a copy of DIR's token files and --store-url-file.

Options:
  --from sqlite:DIR   the data dir of the control plane to copy (stop it first, so that
                      nothing it writes after the copy is left behind)
  --to-file FILE      read the target postgres:// URL from FILE (keep it 0600)
  --to URL            the target URL; refused with a password in it (argv is public): use
                      --to-file, LLMGW_STORE_URL, PGPASSWORD or ~/.pgpass
  --force             replace what the target holds (refused otherwise); a target a
                      control plane leads is always refused
  --json              print the report as JSON
`,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, {
      from: { type: "string" },
      to: { type: "string" },
      "to-file": { type: "string" },
      force: { type: "boolean" },
      json: { type: "boolean" },
    });
    const from = values.from;
    if (from === undefined || !from.startsWith("sqlite:") || from.length <= "sqlite:".length)
      throw new UsageError("--from sqlite:DIR is required (the data dir of the SQLite store)");
    const to = storeUrl(
      values.to,
      values["to-file"],
      io.env.LLMGW_STORE_URL,
      (w) => io.stderr.write(`llmgw control-plane migrate-store: warning: ${w}\n`),
      { flag: "--to", file: "--to-file" },
    );
    if (to === undefined || !/^postgres(ql)?:\/\//.test(to))
      throw new UsageError(
        "a postgres:// target is required: --to-file FILE, --to URL or LLMGW_STORE_URL",
      );
    try {
      const report = await migrateStore({
        fromDataDir: from.slice("sqlite:".length),
        toUrl: to,
        force: values.force ?? false,
      });
      if (values.json) {
        io.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
        return 0;
      }
      io.stdout.write(
        `copied into ${report.target} in ${report.durationMs} ms and checked: ${STORE_TABLES.map((t) => `${report.counts[t]} ${t}`).join(", ")}\nchecksum ${report.checksum}\n`,
      );
      return 0;
    } catch (error) {
      if (isControlPlaneError(error)) {
        io.stderr.write(`llmgw control-plane migrate-store: ${error.message} [${error.code}]\n`);
        return 1;
      }
      throw error;
    }
  },
};
