#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` from the source shipped inside the node-llama-cpp npm
# package into an ignored cache outside the repository, so that every clone on this machine
# (CI included) reuses one build. Idempotent: an existing build of the same release is kept.
#
#   LLMGW_CACHE_DIR   cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/llmgw)
#
# Prints the path of the binary on its last line.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${LLMGW_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/llmgw}"
pkg="$root/node_modules/node-llama-cpp/llama"
if [ ! -f "$pkg/gitRelease.bundle" ]; then
  echo "build-llamacpp: $pkg/gitRelease.bundle is missing; run 'pnpm install' first" >&2
  exit 1
fi
release="$(node -e 'console.log(require(process.argv[1]).tag)' "$pkg/llama.cpp.info.json")"
out="$cache/llama.cpp/$release"
bin="$out/bin/llama-server"
if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
  echo "$bin"
  exit 0
fi
# One build at a time per release: a second caller (a test, CI, the demo) waits for the first
# and then reuses its binary instead of compiling the same thing twice on 2 cores.
mkdir -p "$cache/llama.cpp"
exec 9>"$cache/llama.cpp/.build-$release.lock"
if ! flock -n 9; then
  echo "build-llamacpp: another build of $release is running; waiting for it" >&2
  flock 9
fi
if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
  echo "$bin"
  exit 0
fi
for tool in cmake g++ git; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "build-llamacpp: installing $tool with apt-get" >&2
    if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++ git) >&2; then
      echo "build-llamacpp: $tool is missing and apt-get could not install it; install cmake, g++ and git, then retry" >&2
      exit 1
    fi
  fi
done
work="$out.build.$$"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
echo "build-llamacpp: building llama-server $release into $out (about 6 minutes on 2 cores, once)" >&2
git -c advice.detachedHead=false clone -q "$pkg/gitRelease.bundle" "$work/src" >&2
cmake -S "$work/src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF >"$work/cmake.log" 2>&1 ||
  { tail -40 "$work/cmake.log" >&2; echo "build-llamacpp: cmake configure failed" >&2; exit 1; }
jobs="$(nproc 2>/dev/null || echo 2)"
cmake --build "$work/build" --target llama-server -j "$jobs" 2>&1 |
  awk '/\[ *[0-9]+%\]/ { if (match($0, /\[ *[0-9]+%\]/)) { p = substr($0, RSTART, RLENGTH); if (p != last) { print "build-llamacpp: " p > "/dev/stderr"; last = p } } }'
if [ ! -x "$work/build/bin/llama-server" ]; then
  echo "build-llamacpp: the build produced no llama-server binary" >&2
  exit 1
fi
mkdir -p "$out/bin"
cp "$work/build/bin/llama-server" "$bin.tmp"
mv "$bin.tmp" "$bin"
echo "$bin"
