"""The documentation stays true: generated pages are current, every config it shows loads, the
README stays a front page."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from adapters import registry
from gateway.config import load_settings
from gateway.docgen import COMMAND, config_ref, generate, stale
from tests.unit.planning import recipes

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
SNIPPET = re.compile(r'^--8<-- "([^"]+)"$', re.M)
YAML_BLOCK = re.compile(r"^(?P<indent>[ \t]*)```yaml\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)


def yaml_blocks() -> list[tuple[str, str]]:
    found = []
    for page in DOCS:
        text = page.read_text()
        for m in YAML_BLOCK.finditer(text):
            indent = len(m.group("indent"))
            body = "".join(line[indent:] for line in m.group("body").splitlines(keepends=True))
            body = SNIPPET.sub(lambda s: (ROOT / s.group(1)).read_text(), body)  # pymdownx.snippets' include
            found.append((f"{page.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}", body))
    return found


def test_the_docs_show_configs() -> None:
    assert len(yaml_blocks()) >= 10  # the README's, the recipes', routing, engines


@pytest.mark.parametrize(("where", "body"), yaml_blocks(), ids=[w for w, _ in yaml_blocks()])
def test_every_config_in_the_docs_loads(where: str, body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("ENGINEGATE_")]:
        monkeypatch.delenv(name)
    path = tmp_path / "config.yaml"
    path.write_text(body)
    settings = load_settings(path)  # as `enginegate serve --config` reads it
    known = set(registry.names()) | {"auto"}
    engines = [m.engine for m in settings.models] + [b.engine for m in settings.models for b in m.backends]
    assert set(engines) <= known, f"{where}: unknown engine in {engines}"


def test_generated_references_are_current() -> None:
    assert not stale(ROOT), f"out of date: {stale(ROOT)}; run `{COMMAND}` and commit the result"


def test_recipes_are_current() -> None:
    for r in recipes.RECIPES:
        assert recipes.page_block(r) == recipes.block(r), f"docs/getting-started/{r.page}.md: run `{COMMAND}`"


def test_generation_is_deterministic() -> None:
    assert generate() == generate()


def test_every_setting_has_a_description() -> None:
    assert not config_ref.undocumented(), (
        f"settings without a docstring: {config_ref.undocumented()} (write one under the field; a new nested "
        "model needs ConfigDict(use_attribute_docstrings=True))")


def test_the_readme_is_a_front_page() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    first_screen = "\n".join(text.splitlines()[:60])
    assert "make serve" in first_screen and "--model" in first_screen  # the embedded model, then your own
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).exists(), f"README links to a missing {link}"


def test_every_metric_the_pages_name_is_served() -> None:
    """The explanations may name any metric; the list is the generated reference. A name the code no
    longer registers (or, for an engine's own metric, no longer reads) fails here."""
    from gateway.docgen.metrics_ref import collected

    served = set()
    for _, docs in collected():
        for d in docs:
            base = d.name.removesuffix("_total")
            served |= {d.name, base, f"{base}_created", f"{base}_bucket", f"{base}_sum", f"{base}_count"}
    pages = [p for p in DOCS if "reference" not in p.parts]
    named = {(p.name, n) for p in pages for n in re.findall(r"\b(?:enginegate_[a-z0-9_]*[a-z0-9]|vllm:[a-z_]+)", p.read_text())}
    prefixes = ("enginegate_engine_", "enginegate_gpu_", "enginegate_replica_", "enginegate_process_")
    said_not_served = {"vllm:cache_config_info"}  # docs/metrics.md says the gateway does not serve it
    read_from_engines = {name for s in registry.specs() if s.server is not None for name in s.server.metrics_map.values()}
    unknown = sorted((page, n) for page, n in named
                     if n not in served | said_not_served | read_from_engines and n not in prefixes)
    assert not unknown, f"pages name metrics that nothing registers: {unknown}"
