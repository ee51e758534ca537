from __future__ import annotations

from pathlib import Path

import pytest

from gateway.modelsource import HubReference, ModelSourceError, embedded_model_path, parse_hub_reference, resolve


@pytest.mark.parametrize(
    "text, expected",
    [
        ("org/repo/model.gguf", HubReference("org/repo", "model.gguf")),
        ("org/repo/sub/dir/model.gguf", HubReference("org/repo", "sub/dir/model.gguf")),
        ("org/repo:model.gguf", HubReference("org/repo", "model.gguf")),
        ("hf://org/repo/model.gguf@v2", HubReference("org/repo", "model.gguf", "v2")),
        ("model.gguf", None),
        ("org/model.gguf", None),
    ],
)
def test_parse_hub_reference(text: str, expected: HubReference | None) -> None:
    assert parse_hub_reference(text) == expected


def test_default_is_the_embedded_gguf() -> None:
    resolved = resolve("default")
    assert resolved.path == embedded_model_path()
    assert resolved.path.read_bytes()[:4] == b"GGUF"
    assert resolved.origin == "embedded"


def test_local_path(tmp_path: Path) -> None:
    f = tmp_path / "tiny.gguf"
    f.write_bytes(b"GGUF")
    r = resolve(str(f))
    assert r.path == f and r.default_id == "tiny" and r.origin == "local"


def test_missing_local_path_is_a_clear_error() -> None:
    with pytest.raises(ModelSourceError, match="model file not found"):
        resolve("./nope/model.gguf")
