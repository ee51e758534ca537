"""`mlx_lm.server`, launched and supervised (engine name `mlx_server`; in-process is `mlx`).

Its `/health` answers 200 while the model still loads in a background thread, so readiness is
a one-token chat completion that succeeds. It has no API key, served-name or context flag: the
relay sends `default_model`, which the server maps to its `--model`. Its errors are a bare
string (`{"error": "..."}`), its stream repeats the role in every delta and sends `: keepalive`
comments; the relay handles both. With no Hugging Face cache directory its `/v1/models` once
sent headers and an empty body, so `HF_HOME` is pointed at an existing directory.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from adapters.base import Capabilities, RequestContext
from adapters.engine_server import EngineServer
from adapters.launch import LaunchOptions
from adapters.mlx import INSTALL_HINT
from adapters.process import Endpoint, Launch, ManagedProcess
from adapters.spec import EngineSpec, ServerSpec

PROBE = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}


def mlx_server_argv(model_path: str, opts: LaunchOptions, endpoint: Endpoint, max_tokens: int | None) -> list[str]:
    argv = opts.program([opts.python, "-m", "mlx_lm", "server"])
    argv += ["--model", model_path, "--host", endpoint.host, "--port", str(endpoint.port)]
    if max_tokens:
        argv += ["--max-tokens", str(max_tokens)]
    return argv


class MLXServerAdapter(EngineServer):

    def command(self, endpoint: Endpoint) -> Launch:
        env: dict[str, str] = {}
        if "HF_HOME" not in os.environ and not (Path.home() / ".cache" / "huggingface").is_dir():
            env["HF_HOME"] = str(self.run_dir("hf-home"))
        max_tokens = self.options.get("max_tokens")
        return Launch(mlx_server_argv(self.model_path, self.launch_options, endpoint, max_tokens), env)

    async def ready(self, process: ManagedProcess, endpoint: Endpoint) -> bool:
        try:
            async with asyncio.timeout(10.0):
                await self.relay.complete(self._upstream_for(endpoint), "/v1/chat/completions", dict(PROBE),
                                          RequestContext("readiness", "default_model"))
        except Exception:  # noqa: BLE001 - anything but a completion means not ready yet
            return False
        return True


SPEC = EngineSpec(
    name="mlx_server",
    adapter=MLXServerAdapter,
    capabilities=Capabilities(chat=True, completions=True, embeddings=False, tools=True),
    install_hint=INSTALL_HINT,
    python_modules=("mlx_lm",),
    plans_as="mlx",
    layout_options=lambda lay: {},  # mlx_lm.server takes no context or memory flag
    default_concurrency=64,
    container_image=None,  # Apple silicon (Metal) only: no container runs it
    server=ServerSpec(ready_path=None, metrics_path=None, uses_api_key=False,
                      upstream_model=lambda config: "default_model"),
)
