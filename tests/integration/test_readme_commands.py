"""The README's first request, exactly as written there, against the gateway `make serve` runs
(the session's `enginegate serve` of the embedded model with default settings)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gateway_process import RunningGateway

pytestmark = pytest.mark.integration

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
DEFAULT_URL = "http://127.0.0.1:8000"


def block(language: str, containing: str) -> str:
    blocks = [b for b in re.findall(rf"^```{language}\n(.*?)^```", README, re.M | re.S) if containing in b]
    assert len(blocks) == 1, f"the README should show one {language} block with {containing!r}"
    assert DEFAULT_URL in blocks[0]
    return blocks[0]


def test_the_readme_quick_start_serves_the_embedded_model_with_defaults() -> None:
    commands = block("sh", "make serve")
    assert "make serve" in commands and "make test" in commands
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert "$(VENV)/bin/enginegate serve $(ARGS)" in makefile  # what the session's gateway runs, without ARGS


def test_the_readme_curl_command(gw: RunningGateway) -> None:
    command = block("sh", "curl").replace(DEFAULT_URL, gw.url)
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300, check=True).stdout
    reply = json.loads(out)
    assert reply["object"] == "chat.completion" and reply["choices"][0]["message"]["content"]


def test_the_readme_python_snippet(gw: RunningGateway) -> None:
    code = block("python", "OpenAI(").replace(DEFAULT_URL, gw.url)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip(), "the streamed haiku printed nothing"
