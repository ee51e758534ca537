"""The embedded model served on both local engines by one gateway: in-process llama.cpp as LOCAL and,
where llama-server is built, llama-server as SERVER (the tests parametrised over both skip SERVER without it)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from adapters.llama_server import find_llama_server
from gateway.modelsource import embedded_model_path

LOCAL = "smollm"
SERVER = "smollm-server"


def both_engines(root: Path, context_length: int) -> list[dict[str, Any]]:
    """The config's `models`: LOCAL always, SERVER when llama-server is built (its logs under root)."""
    weights = str(embedded_model_path())
    models: list[dict[str, Any]] = [{"source": weights, "name": LOCAL, "engine": "llamacpp", "threads": 1,
                                     "context_length": context_length}]
    if find_llama_server(None) is not None:
        models.append({"source": weights, "name": SERVER, "engine": "llama_server", "threads": 1,
                       "context_length": context_length, "options": {"log_dir": str(root / "logs")}})
    return models


def served(name: str) -> str:
    """The model name a test parametrised over LOCAL and SERVER uses, skipping SERVER where it is not built."""
    if name == SERVER and find_llama_server(None) is None:
        pytest.skip("llama-server is not built (make llama-server)")
    return name
