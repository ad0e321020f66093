// A previous agent, in its own process, for the adoption tests: launches one replica's
// ProcessSpec (JSON in argv[2]: { stateDir, replicaId, spec }) through a supervisor, prints
// {"pid":…,"pgid":…} and waits to be SIGKILLed. The engine it started keeps running (own
// process group, output to its log file) for the next supervisor to adopt.
import { createSupervisor, type ProcessSpec } from "@llmgw/supervisor";

interface HostInput {
  readonly stateDir: string;
  readonly replicaId: string;
  readonly spec: ProcessSpec;
}

const input = JSON.parse(process.argv[2] ?? "{}") as HostInput;
const supervisor = createSupervisor({ stateDir: input.stateDir });
const handle = await supervisor.launch(input.replicaId, input.spec);
process.stdout.write(`${JSON.stringify({ pid: handle.pid, pgid: handle.pgid })}\n`);
setInterval(() => {}, 1 << 30);
