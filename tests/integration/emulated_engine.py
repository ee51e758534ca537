"""A ServerAdapter whose engine is the emulator, so supervision is tested on a real process."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from adapters.base import Capabilities
from adapters.process import Endpoint, Launch, ManagedProcess
from adapters.server import ServerAdapter
from adapters.config import EngineConfig
from adapters.spec import EngineSpec, ServerSpec

REPO_ROOT = Path(__file__).resolve().parents[2]


class EmulatedEngine(ServerAdapter):
    def __init__(self, config: EngineConfig, spec: EngineSpec) -> None:
        super().__init__(config, spec)
        self.style = str(self.options.get("style", "llamacpp"))
        self.flags = [str(f) for f in self.options.get("flags", [])]

    def launch(self, endpoint: Endpoint) -> Launch:
        argv = [sys.executable, "-m", "tests.emulators.engine_emulator", "--style", self.style,
                "--host", endpoint.host, "--port", str(endpoint.port), "--model", self.served, "--metrics"]
        if endpoint.api_key:
            argv += ["--api-key", endpoint.api_key]
        env = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p),
               "PYTHONUNBUFFERED": "1"}
        return Launch(argv + self.flags, env=env, cwd=str(REPO_ROOT))

    async def ready(self, process: ManagedProcess, endpoint: Endpoint) -> bool:
        return process.saw("emulator ready on") and await super().ready(process, endpoint)


SPEC = EngineSpec(
    name="emulated",
    adapter=EmulatedEngine,
    capabilities=Capabilities(embeddings=True),
    default_concurrency=64,
    server=ServerSpec(
        ready_path=None,
        metrics_map={
            "requests_running": "llamacpp:requests_processing",
            "requests_waiting": "llamacpp:requests_deferred",
            "prompt_tokens_total": "llamacpp:prompt_tokens_total",
            "generation_tokens_total": "llamacpp:tokens_predicted_total",
        },
    ),
)


def emulated(tmp_path: Path, style: str = "llamacpp", *flags: str, **options: Any) -> EmulatedEngine:
    opts: dict[str, Any] = {"style": style, "flags": list(flags), "log_dir": str(tmp_path), **options}
    adapter = SPEC.create(EngineConfig(source="emulated", name="emulated-model", options=opts))
    assert isinstance(adapter, EmulatedEngine)
    return adapter
