from pathlib import Path

import pytest
import yaml

from gateway.planning import ENGINES, Workload, installed_set, load_rules, load_workload, plan
from gateway.planning.installed import is_installed
from gateway.planning.selection import DEFAULT_RULES
from gateway.planning.workload import heaviness
from tests.unit.hosts import embedded_gguf, host

ALL = installed_set(set(ENGINES))


def test_default_rules_cover_every_engine() -> None:
    book = load_rules()
    assert set(book.engines) == set(ENGINES)
    preferred = {e for r in book.rules for e in r.prefer}
    assert preferred == set(ENGINES)
    assert book.rules[-1].when == {}  # a fallback that always holds


def test_engine_facts_are_read_from_each_engines_spec() -> None:
    from adapters import registry

    book = load_rules()
    for name, needs in book.engines.items():
        spec = registry.spec(name)
        assert (needs.accelerators, needs.formats, needs.min_compute_capability, needs.needs_fast_memory,
                needs.install) == (spec.accelerators, spec.formats, spec.min_compute_capability,
                                   spec.needs_fast_memory, spec.install_hint)
    assert "engines" not in yaml.safe_load(DEFAULT_RULES.read_text())  # the YAML keeps only preferences


def test_user_rules_come_first_and_engines_can_be_overridden(tmp_path: Path) -> None:
    from gateway.planning import load_spec

    user = tmp_path / "mine.yaml"
    user.write_text(
        yaml.safe_dump(
            {
                "engines": {"vllm": {"formats": ["gguf", "bf16"]}},
                "rules": [
                    {
                        "name": "site-policy",
                        "when": {"accelerator": "none"},
                        "prefer": ["vllm"],
                        "because": "our CPU fleet runs vLLM",
                    }
                ],
            }
        )
    )
    book = load_rules(user)
    assert book.rules[0].name == "site-policy" and len(book.rules) == len(load_rules().rules) + 1
    assert book.engines["vllm"].formats == ("gguf", "bf16")
    assert book.engines["vllm"].install == load_rules().engines["vllm"].install  # merged, not replaced
    p = plan(host("build-machine"), load_spec(embedded_gguf()), rules=book, installed=ALL)
    assert p.engine == "vllm" and "our CPU fleet runs vLLM [rule: site-policy]" == p.reasons[0]


def test_replace_rules(tmp_path: Path) -> None:
    user = tmp_path / "only.yaml"
    user.write_text(
        yaml.safe_dump(
            {"replace_rules": True, "rules": [{"name": "only", "when": {}, "prefer": ["llamacpp"], "because": "x"}]}
        )
    )
    assert [r.name for r in load_rules(user).rules] == ["only"]


@pytest.mark.parametrize(
    "doc,match",
    [
        ({"rules": [{"name": "r", "when": {"gpu": 1}, "prefer": ["vllm"], "because": "x"}]}, "unknown condition"),
        ({"rules": [{"name": "r", "when": {}, "prefer": ["ollama"], "because": "x"}]}, "no engines entry"),
        ({"engines": {"ollama": {"accelerators": ["none"], "formats": ["gguf"], "install": "x"}}}, "unknown engine"),
        ({"rules": [{"name": "r", "prefer": ["vllm"]}]}, "because"),
    ],
)
def test_bad_rule_files_are_rejected_with_the_reason(tmp_path: Path, doc: dict, match: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match=match):
        load_rules(f)


def test_shipped_file_is_the_default() -> None:
    assert DEFAULT_RULES.is_file() and DEFAULT_RULES.name == "selection.yaml"


def test_workload_yaml(tmp_path: Path) -> None:
    f = tmp_path / "w.yaml"
    f.write_text("prompt_tokens: 8000\noutput_tokens: 200\nconcurrency: 16\nmode: production\nshared_prefix: true\n")
    w = load_workload(f)
    assert (w.concurrency, w.mode, w.shared_prefix) == (16, "production", True)
    f.write_text("concurency: 4\n")
    with pytest.raises(ValueError, match="concurency"):
        load_workload(f)
    f.write_text("- a list\n")
    with pytest.raises(ValueError, match="mapping"):
        load_workload(f)
    assert Workload().mode == "local"


@pytest.mark.parametrize("prompt,output,heavy", [(8000, 200, "prefill"), (100, 1000, "decode"), (500, 300, "balanced")])
def test_prefill_or_decode_heavy(prompt: int, output: int, heavy: str) -> None:
    assert heaviness(prompt, output) == heavy


def test_real_installed_check() -> None:
    import importlib.util

    from adapters.llama_server import find_llama_server

    # one answer per engine, the adapter's own: the module for in-process llama.cpp, the binary for llama-server
    assert is_installed("llamacpp") == (importlib.util.find_spec("llama_cpp") is not None)
    assert is_installed("llama_server") == (find_llama_server(None) is not None)
    assert is_installed("tensorrt_llm") is False or importlib.util.find_spec("tensorrt_llm") is not None
    with pytest.raises(KeyError):
        is_installed("nope")
