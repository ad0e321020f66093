import type { Command } from "../command.js";
import { LLMGW_VERSION } from "../version.js";

export const command: Command = {
  name: "version",
  summary: "print the llmgw version",
  usage: "Usage: llmgw version\n\nPrints the llmgw version.",
  async run(_argv, io) {
    io.stdout.write(`llmgw ${LLMGW_VERSION}\n`);
    return 0;
  },
};
