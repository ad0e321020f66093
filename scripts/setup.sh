#!/usr/bin/env bash
# Everything a fresh machine with only Node.js >= 20 and npm needs, installed idempotently:
# pnpm, the workspace's dependencies, Debian packages used by tests and benchmarks, and the
# llama.cpp server build (cached outside the repository). Safe to run again and again.
#
#   LLMGW_SKIP_APT=1       do not install Debian packages
#   LLMGW_SKIP_LLAMACPP=1  do not build llama-server
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
say() { printf 'setup: %s\n' "$*" >&2; }

if ! command -v pnpm >/dev/null 2>&1 || ! pnpm --version 2>/dev/null | grep -q '^12\.'; then
  say "installing pnpm 12 with npm"
  npm install -g pnpm@12.21.0 >/dev/null
fi

# better-sqlite3 compiles against Node's own headers; pnpm ignores .npmrc's nodedir.
if [ -f /usr/include/node/node.h ]; then export npm_config_nodedir=/usr; fi
export TURBO_TELEMETRY_DISABLED=1
say "installing dependencies (pnpm install --frozen-lockfile)"
pnpm install --frozen-lockfile --reporter=append-only 2>&1 | grep -Ev '^(Progress|\.\.\./)' >&2 || {
  say "pnpm install failed"; exit 1; }

apt_pkgs=(nginx-light haproxy prometheus wrk cmake g++ git postgresql lintian chromium)
if [ "${LLMGW_SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in "${apt_pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      say "installing Debian packages: ${missing[*]}"
      apt-get update -qq >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
      # The packages' own services are not wanted: tests start their own instances.
      for svc in nginx haproxy prometheus prometheus-node-exporter postgresql; do
        (service "$svc" stop || true) >/dev/null 2>&1
      done
    else
      say "missing Debian packages (${missing[*]}); tests that need them will say they are skipped"
    fi
  fi
fi

if [ "${LLMGW_SKIP_LLAMACPP:-0}" != 1 ]; then
  bash scripts/build-llamacpp.sh >/dev/null
fi
say "ready"
