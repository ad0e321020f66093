import { type CliIo, type Command, UsageError } from "./command.js";
import { commands } from "./commands.js";

function topLevelHelp(): string {
  const names = Object.keys(commands).sort();
  const width = Math.max(...names.map((n) => n.length));
  return [
    "llmgw: one LLM-serving cluster from a fleet of GPU machines",
    "",
    "Usage: llmgw <command> [options]   (llmgw <command> --help for details)",
    "",
    "Commands:",
    ...names.map((n) => `  ${n.padEnd(width)}`),
    "",
  ].join("\n");
}

/** Finds the longest registered command name that prefixes argv. */
export function resolveCommand(argv: string[]): { key: string; rest: string[] } | undefined {
  for (let take = Math.min(argv.length, 3); take > 0; take--) {
    const key = argv.slice(0, take).join(" ");
    if (key in commands) return { key, rest: argv.slice(take) };
  }
  return undefined;
}

/** Runs `llmgw` with argv (without node and script); returns the exit code. */
export async function runCli(argv: string[], io: CliIo): Promise<number> {
  if (argv.length === 0 || argv[0] === "--help" || argv[0] === "-h" || argv[0] === "help") {
    io.stdout.write(topLevelHelp());
    return argv.length === 0 ? 2 : 0;
  }
  if (argv[0] === "--version") argv = ["version"];
  const found = resolveCommand(argv);
  if (!found) {
    // Its words only: what follows may be a flag's secret (`--token T`), and stderr goes to
    // terminals, logs and CI output.
    const end = argv.findIndex((a) => a.startsWith("-"));
    const words = end < 0 ? argv : argv.slice(0, end);
    io.stderr.write(
      `llmgw: unknown command "${words.join(" ")}"${end === 0 ? " (arguments start with a flag)" : ""}\n\n${topLevelHelp()}`,
    );
    return 2;
  }
  const load = commands[found.key];
  if (!load) return 2;
  const command: Command = await load();
  if (found.rest.includes("--help") || found.rest.includes("-h")) {
    io.stdout.write(`${command.usage.trimEnd()}\n`);
    return 0;
  }
  try {
    return await command.run(found.rest, io);
  } catch (error) {
    if (error instanceof UsageError) {
      io.stderr.write(
        `llmgw ${command.name}: ${error.message}\nRun 'llmgw ${command.name} --help' for usage.\n`,
      );
      return 2;
    }
    throw error;
  }
}
