"""The evaluation clients against a real gateway serving the embedded model, offline (no model hub):
lm-eval 0.4.13 (`local-completions` loglikelihood with the gateway's own tokenizer, `local-chat-completions`
generate_until) and guidellm 0.8.1 (`guidellm run` for 20 s, its tokenizer made from the GGUF).

Both live in their own venv (`scripts/engine_venvs.sh eval`; EVAL_PYTHON overrides). The loglikelihoods
lm-eval reports are checked against llama-cpp-python's own logits for the same tokens."""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from gateway.modelsource import embedded_model_path
from tests.engines.real_engines import engine_python
from tests.gateway_process import RunningGateway, gateway

pytestmark = pytest.mark.integration

MODEL = "smol"
CONTEXT = 2048
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "*",
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
"""No hub, and any other outbound HTTP goes to a closed port (the gateway is reached directly: NO_PROXY)."""
QUESTIONS = [
    {"question": "The capital of France is", "choices": ["Paris", "London", "Berlin"], "answer": 0},
    {"question": "Two plus two equals", "choices": ["four", "seven", "blue"], "answer": 0},
    {"question": "The opposite of hot is", "choices": ["cold", "warm", "loud"], "answer": 0},
]
ASKED = [{"question": "What is the capital of France? Answer with one word.", "answer": "Paris"},
         {"question": "What is two plus two? Answer with a number.", "answer": "4"}]


@pytest.fixture(scope="module")
def python() -> str:
    return engine_python("EVAL_PYTHON", "eval", "import lm_eval, guidellm, gguf")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    model = {"source": str(embedded_model_path()), "name": MODEL, "engine": "llamacpp", "threads": 2,
             "context_length": CONTEXT, "embeddings": False, "options": {"scoring": True}}
    root = tmp_path_factory.mktemp("eval-gw")
    with gateway(config_yaml=yaml.safe_dump({"models": [model]}), env={"XDG_DATA_HOME": str(root)}) as running:
        yield running


def _run(python: str, args: list[str], cwd: Path) -> str:
    env = {**os.environ, **OFFLINE, "HF_HOME": str(cwd / "hf")}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([python, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout


def _task(folder: Path, name: str, rows: list[dict[str, Any]], spec: dict[str, Any]) -> None:
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
            "test_split": "test", "doc_to_text": "{{question}}", **spec}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(task))


def _samples(out: Path, task: str) -> list[dict[str, Any]]:
    [path] = list(out.rglob(f"samples_{task}_*.jsonl"))
    return [json.loads(line) for line in path.read_text().splitlines()]


def _continuation_logprob(llm: Any, context: str, continuation: str) -> float:
    """llama-cpp-python's own score of `continuation` after `context`, tokenized as lm-eval does (the whole
    text, the context's tokens split off), with every position's logits (logits_all)."""
    whole = llm.tokenize((context + continuation).encode(), add_bos=False, special=True)
    ctxlen = len(llm.tokenize(context.encode(), add_bos=False, special=True))
    llm.reset()
    llm.eval(whole)
    logits = np.asarray(llm.scores[: len(whole)], dtype=np.float64)
    total = 0.0
    for i in range(ctxlen, len(whole)):
        row = logits[i - 1]
        top = row.max()
        total += float(row[whole[i]] - (top + math.log(np.exp(row - top).sum())))
    return total


def test_lm_eval_scores_multiple_choice_as_llama_cpp_does(gw: RunningGateway, python: str, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    _task(tasks, "tiny_mc", QUESTIONS, {"output_type": "multiple_choice", "doc_to_choice": "{{choices}}",
                                        "doc_to_target": "{{answer}}", "metric_list": [{"metric": "acc"}]})
    args = ["-m", "lm_eval", "--model", "local-completions", "--model_args",
            f"model={MODEL},base_url={gw.base_url}/completions,tokenizer_backend=remote,num_concurrent=1,max_retries=1",
            "--tasks", "tiny_mc", "--include_path", str(tasks), "--output_path", str(tmp_path / "out"), "--log_samples"]
    _run(python, args, tmp_path)
    samples = _samples(tmp_path / "out", "tiny_mc")
    assert len(samples) == len(QUESTIONS) and all("acc" in s for s in samples)

    from llama_cpp import Llama

    llm = Llama(model_path=str(embedded_model_path()), n_ctx=CONTEXT, n_threads=1, logits_all=True, verbose=False)
    try:
        for sample in samples:
            for i, response in enumerate(sample["filtered_resps"]):
                arg = sample["arguments"][f"gen_args_{i}"]
                want = _continuation_logprob(llm, arg["arg_0"], arg["arg_1"])
                assert abs(float(response[0]) - want) < 1e-3, (arg, response, want)
    finally:
        llm.close()


def test_lm_eval_generates_through_chat_completions(gw: RunningGateway, python: str, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    _task(tasks, "tiny_gen", ASKED, {"output_type": "generate_until", "doc_to_target": "{{answer}}",
                                     "generation_kwargs": {"until": ["\n"], "max_gen_toks": 16, "do_sample": False},
                                     "metric_list": [{"metric": "exact_match"}]})
    args = ["-m", "lm_eval", "--model", "local-chat-completions", "--apply_chat_template", "--model_args",
            f"model={MODEL},base_url={gw.base_url}/chat/completions,num_concurrent=1,max_retries=1",
            "--tasks", "tiny_gen", "--include_path", str(tasks), "--output_path", str(tmp_path / "out"), "--log_samples"]
    _run(python, args, tmp_path)
    samples = _samples(tmp_path / "out", "tiny_gen")
    assert len(samples) == len(ASKED)
    assert all(isinstance(s["exact_match"], float) for s in samples)
    assert all(s["filtered_resps"][0].strip() for s in samples), samples  # the model answered something


def test_guidellm_runs_20_seconds_with_the_ggufs_tokenizer(gw: RunningGateway, python: str, tmp_path: Path) -> None:
    weights = embedded_model_path()
    tokenizer = tmp_path / "tokenizer"
    _run(python, ["-c", "import sys; from transformers import AutoTokenizer; "
                        "AutoTokenizer.from_pretrained(sys.argv[1], gguf_file=sys.argv[2]).save_pretrained(sys.argv[3])",
                  str(weights.parent), weights.name, str(tokenizer)], tmp_path)
    report = tmp_path / "guidellm.json"
    _run(str(Path(python).with_name("guidellm")), [
        "run", "--backend", f"kind=openai_http,target={gw.url},model={MODEL}",
        "--tokenizer", f"kind=hf_auto,model={tokenizer}",
        "--data", "kind=synthetic_text,prompt_tokens=16,output_tokens=4",
        "--profile", "kind=synchronous", "--constraint", "kind=max_duration,seconds=20",
        "--output", f"kind=json,path={report}", "--disable-console-interactive"], tmp_path)
    [benchmark] = json.loads(report.read_text())["benchmarks"]
    totals = benchmark["metrics"]["request_totals"]
    assert totals["successful"] >= 1 and totals["errored"] == 0, totals
