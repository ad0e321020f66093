#!/usr/bin/env bash
# The gates, in order of cost: proto lint and generated-code drift, build, typecheck, lint,
# then every test. Assumes scripts/setup.sh ran.
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
step "tests"
vitest run "$@"
