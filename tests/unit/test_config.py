from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.config import Settings, load_settings

YAML = """
port: 9100
host: 0.0.0.0
log_level: debug
models:
  - source: /models/a.gguf
    name: a
    max_queue: 3
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(YAML)
    return path


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("ENGINEGATE_PORT", "ENGINEGATE_HOST", "ENGINEGATE_CONFIG", "ENGINEGATE_LOG_LEVEL"):
        monkeypatch.delenv(key, raising=False)


def test_defaults() -> None:
    s = load_settings()
    assert (s.host, s.port, s.log_level) == ("127.0.0.1", 8000, "info")
    assert s.models[0].source == "default"


def test_yaml_is_read(config_file: Path) -> None:
    s = load_settings(config_file)
    assert (s.host, s.port, s.log_level) == ("0.0.0.0", 9100, "debug")
    assert s.models[0].name == "a" and s.models[0].max_queue == 3


def test_env_beats_yaml_and_flags_beat_env(config_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINEGATE_PORT", "9200")
    monkeypatch.setenv("ENGINEGATE_LOG_LEVEL", "warning")
    s = load_settings(config_file)
    assert s.port == 9200 and s.log_level == "warning" and s.host == "0.0.0.0"
    s = load_settings(config_file, port=9300)
    assert s.port == 9300 and s.log_level == "warning"


def test_config_file_from_env(config_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGINEGATE_CONFIG", str(config_file))
    assert load_settings().port == 9100


def test_model_flag_replaces_configured_models(config_file: Path) -> None:
    s = load_settings(config_file, model="/other.gguf")
    assert [m.source for m in s.models] == ["/other.gguf"]


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config file not found"):
        load_settings(tmp_path / "nope.yaml")


def test_unknown_keys_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("prot: 1\n")
    with pytest.raises(ValidationError):
        load_settings(path)


def test_settings_are_frozen() -> None:
    with pytest.raises(ValidationError):
        Settings().port = 1  # type: ignore[misc]


def test_example_config_loads() -> None:
    example = Path(__file__).resolve().parents[2] / "configs" / "gateway.example.yaml"
    s = load_settings(example)
    assert s.models[0].source == "default" and s.port == 8000
    assert s.models[0].replicas == 1 and s.models[0].routing.balance == "least_outstanding"
