import { MIGRATIONS } from "@llmgw/control-plane";
import { PROTO_PACKAGE } from "@llmgw/wire";
import { type Command, parseCommandArgs } from "../command.js";
import { LLMGW_COMMIT, LLMGW_VERSION } from "../version.js";

/** What `llmgw version --json` prints: enough to tell two builds, and their contracts, apart. */
export interface VersionInfo {
  version: string;
  /** Absent when running from source rather than a built bundle. */
  commit?: string;
  /** The protobuf package of every RPC; compatible release to release (`buf breaking`). */
  proto: string;
  /** The state store's schema version this build writes (and migrates older stores to). */
  storeSchema: number;
  node: string;
}

export function versionInfo(): VersionInfo {
  return {
    version: LLMGW_VERSION,
    ...(LLMGW_COMMIT === undefined ? {} : { commit: LLMGW_COMMIT }),
    proto: PROTO_PACKAGE,
    storeSchema: MIGRATIONS.length,
    node: process.version,
  };
}

export const command: Command = {
  name: "version",
  summary: "print the llmgw version",
  usage:
    "Usage: llmgw version [--json]\n\nPrints the llmgw version, the commit it was built from, the wire contract (protobuf package)\nand the state store's schema version.\n\nOptions:\n  --json  one JSON object: version, commit (absent when run from source), proto, storeSchema, node",
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, { json: { type: "boolean" } });
    const v = versionInfo();
    if (values.json) {
      io.stdout.write(`${JSON.stringify(v)}\n`);
      return 0;
    }
    io.stdout.write(
      `llmgw ${v.version}${v.commit === undefined ? " (from source)" : ` (${v.commit.slice(0, 12)}${v.commit.endsWith("-dirty") ? "-dirty" : ""})`}\n` +
        `proto ${v.proto}, store schema ${v.storeSchema}, node ${v.node}\n`,
    );
    return 0;
  },
};
