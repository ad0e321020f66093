#!/usr/bin/env node
// The only place that touches process argv, env, signals and the exit code.
import { getEventListeners } from "node:events";
import { runCli } from "./cli.js";

// `llmgw … --json | head` closes stdout once the reader has what it wants: that is the reader
// being done, not a failure, so exit quietly with success instead of an unhandled EPIPE. A
// closed stderr only loses diagnostics; the command's own exit code still stands.
process.stdout.on("error", (error: NodeJS.ErrnoException) => {
  if (error.code === "EPIPE") process.exit(0);
  throw error;
});
process.stderr.on("error", (error: NodeJS.ErrnoException) => {
  if (error.code !== "EPIPE") throw error;
});

const controller = new AbortController();
const interrupt = new AbortController();
let signals = 0;
for (const sig of ["SIGINT", "SIGTERM"] as const) {
  process.on(sig, () => {
    signals += 1;
    // A second signal cuts short what the first began (an agent's drain) when a command
    // listens for it; otherwise, and always on a third, it exits at once.
    if (signals === 2 && getEventListeners(interrupt.signal, "abort").length > 0) {
      interrupt.abort(new Error(`received ${sig} again`));
      return;
    }
    if (signals > 1) process.exit(130);
    controller.abort(new Error(`received ${sig}`));
  });
}

runCli(process.argv.slice(2), {
  stdout: process.stdout,
  stderr: process.stderr,
  env: process.env,
  cwd: process.cwd(),
  signal: controller.signal,
  interrupt: interrupt.signal,
}).then(
  (code) => {
    process.exitCode = code;
    // A daemon command has returned: whatever still holds the event loop (a supervisor's
    // log poller, an idle keep-alive socket) must not keep the process alive. Engines are
    // separate process groups and are unaffected. Short delay: let stdout drain first.
    setTimeout(() => process.exit(code), 200).unref();
  },
  (error: unknown) => {
    process.stderr.write(
      `llmgw: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`,
    );
    process.exitCode = 1;
  },
);
