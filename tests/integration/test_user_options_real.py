"""The user's options reach a real engine: `enginegate serve` launches llama-server with what the config says.

Needs the llama-server binary (`enginegate engines install llama-server`) and the embedded model.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import psutil
import pytest

from adapters.llama_server import find_llama_server
from gateway.modelsource import embedded_model_path
from tests.gateway_process import gateway

pytestmark = pytest.mark.integration
if find_llama_server(None) is None:
    pytest.skip("needs llama-server (enginegate engines install llama-server)", allow_module_level=True)

CONFIG = """\
models:
  - source: {weights}
    name: smollm
    engine: llama_server
    context_length: 1024
    embeddings: false
    options: {{parallel: 3, threads: 1, log_dir: "{logs}"}}
"""


def test_options_set_in_the_config_are_what_llama_server_runs_with(tmp_path: Path) -> None:
    with gateway(config_yaml=CONFIG.format(weights=embedded_model_path(), logs=tmp_path)) as gw:
        # /ready hides engine PIDs from callers without a key: find the engine among the gateway's children.
        engines = [p for p in psutil.Process(gw.process.pid).children(recursive=True) if "llama-server" in p.name()]
        assert len(engines) == 1, engines
        argv = engines[0].cmdline()
        assert argv[argv.index("-np") + 1] == "3" and argv[argv.index("-c") + 1] == "1024"
        assert argv[argv.index("-t") + 1] == "1"
        slots = [line for line in gw.metrics().splitlines() if line.startswith('enginegate_generation_slots{model="smollm"}')]
        assert slots and float(slots[0].split()[-1]) == 3.0
        plan = httpx.get(gw.url + "/v1/gateway/plan", timeout=10).json()["plans"]["smollm"]
        overridden = {o["option"]: (o["planned"], o["chosen"]) for o in plan["overridden"]}
        assert overridden["parallel"] == (1, 3) and overridden["context_length"][1] == 1024
        assert "user:   parallel=3" in gw.log()
