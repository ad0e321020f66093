#!/usr/bin/env bash
# The README's "run it" command: installs what is missing, builds the `llmgw` command and runs
# the demo. Extra arguments go to `llmgw demo` (e.g. --no-llamacpp, --exit-after-check).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
export TURBO_TELEMETRY_DISABLED=1 PATH="$root/node_modules/.bin:$PATH"
turbo run build --filter=llmgw --output-logs=errors-only >&2
exec node apps/cli/dist/main.js demo "$@"
