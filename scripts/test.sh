#!/usr/bin/env bash
# The README's test command: installs what is missing, then runs every gate and test.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
exec bash "$root/scripts/check.sh" "$@"
