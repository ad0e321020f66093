#!/usr/bin/env bash
# The gates, in order of cost: proto lint and generated-code drift, build, typecheck, lint,
# the demo, then every test. Assumes scripts/setup.sh ran. Arguments go to vitest
# (e.g. a path filter); LLMGW_SKIP_DEMO=1 skips the demo.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export TURBO_TELEMETRY_DISABLED=1 PATH="$root/node_modules/.bin:$PATH"
step() { printf '\n== %s\n' "$*"; }

step "buf lint"
buf lint
if git rev-parse --verify -q origin/main >/dev/null 2>&1 && git cat-file -e origin/main:proto 2>/dev/null; then
  step "buf breaking (against origin/main)"
  buf breaking --against ".git#ref=origin/main"
elif git rev-parse --verify -q HEAD~1 >/dev/null 2>&1 && git cat-file -e HEAD~1:proto 2>/dev/null; then
  step "buf breaking (against the previous commit)"
  buf breaking --against ".git#ref=HEAD~1"
fi

step "generated code is up to date"
buf generate
if ! git diff --exit-code --stat -- packages/proto/src/gen || [ -n "$(git status --porcelain -- packages/proto/src/gen)" ]; then
  echo "packages/proto/src/gen differs from what 'buf generate' produces: run 'pnpm generate' and commit" >&2
  exit 1
fi

step "build"
turbo run build --output-logs=errors-only
step "typecheck"
turbo run typecheck --output-logs=errors-only --concurrency=2
step "lint"
biome check .
if [ "${LLMGW_SKIP_DEMO:-0}" != 1 ]; then
  # The README's other command, end to end: a cluster on this machine and real requests
  # through it (simulated engine and a real llama.cpp server); fails unless every step worked.
  step "llmgw demo --exit-after-check"
  node apps/cli/dist/main.js demo --exit-after-check
fi

step "tests"
results="$(mktemp -t llmgw-vitest-XXXXXX.json)"
set +e
vitest run --reporter=default --reporter=json --outputFile.json="$results" "$@"
status=$?
set -e
# One plain closing line, whatever the runner printed above it.
node -e '
const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
const skipped = (r.numPendingTests ?? 0) + (r.numTodoTests ?? 0);
console.log(`tests: ${r.numPassedTests} passed, ${r.numFailedTests} failed, ${skipped} skipped`);
' "$results" || true
rm -f "$results"
exit "$status"
