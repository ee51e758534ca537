"""EngineServer: what the vLLM, SGLang, TensorRT-LLM, TabbyAPI, Dynamo and mlx_lm.server adapters share.

On top of `ServerAdapter` (ManagedProcess + relay) it adds: the unified launch options parsed
once (a bad value is reported at start as a 503 naming the option, never a stack trace), an
installed-engine check that names the install command, a readiness rule given as one path
(`ready_path` answering 200), and the engine's id for the served model (`upstream_model`) where
the engine cannot be told the gateway's name.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from adapters.base import EngineError
from adapters.launch import LaunchConfigError, LaunchOptions, launch_options
from adapters.openai_http import Upstream, UpstreamConnectionError
from adapters.process import Endpoint, Launch, ManagedProcess
from adapters.server import ServerAdapter
from gateway.config import ModelConfig


class EngineServer(ServerAdapter):
    install_hint: ClassVar[str] = ""
    """The command that installs the engine, quoted in the error when it is missing."""
    python_module: ClassVar[str | None] = None
    """The engine's module (checked with find_spec when it runs on the gateway's own interpreter)."""
    program_name: ClassVar[str | None] = None
    """Or its console program, looked up on PATH."""
    ready_path: ClassVar[str] = "/health"
    upstream_model: ClassVar[str | None] = None

    def __init__(self, model: ModelConfig, options: dict[str, Any]) -> None:
        super().__init__(model, options)
        self._run_dir: Path | None = None
        self.model_path = str(model.source)
        self.config_error: str | None = None
        try:
            self.launch_options = launch_options(self.options)
        except LaunchConfigError as exc:
            self.config_error = str(exc)
            self.launch_options = LaunchOptions()

    def run_dir(self) -> Path:
        """A private folder for the config files an engine is launched with; removed on stop."""
        if self._run_dir is None:
            self._run_dir = Path(tempfile.mkdtemp(prefix=f"enginegate-{self.engine}-"))
        return self._run_dir

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            if self._run_dir is not None:
                shutil.rmtree(self._run_dir, ignore_errors=True)
                self._run_dir = None

    # -- launch ------------------------------------------------------------------------------

    def command(self, endpoint: Endpoint) -> Launch:
        """The engine's command line for this endpoint (pure: no I/O but writing config files)."""
        raise NotImplementedError

    def launch(self, endpoint: Endpoint) -> Launch:
        launch = self.command(endpoint)
        env = {**launch.env, **self.launch_options.env}
        argv = [*launch.argv, *self.launch_options.extra_args]
        return Launch(argv, env, launch.cwd)

    def missing_engine(self) -> str | None:
        """Why the engine cannot run here (and how to install it), or None if it looks installed."""
        opts = self.launch_options
        if opts.executable:
            program = opts.executable[0]
            if shutil.which(program) is None and not Path(program).is_file():
                return f"options.executable names {program!r}, which is neither on PATH nor a file"
            return None
        if self.python_module is not None:
            if opts.python != sys.executable:
                if not Path(opts.python).is_file():
                    return f"options.python names {opts.python!r}, which does not exist"
                return None
            if importlib.util.find_spec(self.python_module.split(".")[0]) is None:
                return (f"the {self.engine} engine is not installed (no Python module "
                        f"{self.python_module.split('.')[0]!r}): {self.install_hint}")
            return None
        if self.program_name is not None and shutil.which(self.program_name) is None:
            return f"the {self.engine} engine is not installed ({self.program_name} is not on PATH): {self.install_hint}"
        return None

    def check(self) -> None:
        """Raise EngineError (503) for a bad option or a missing engine, before any process starts."""
        if self.config_error is not None:
            raise EngineError(f"{self.engine}: {self.config_error}", 503, "invalid_engine_options")
        missing = self.missing_engine()
        if missing is not None:
            raise EngineError(missing, 503, "engine_not_installed")

    async def start(self) -> None:
        self.check()
        await super().start()

    # -- readiness and relay -------------------------------------------------------------------

    async def ready(self, process: ManagedProcess, endpoint: Endpoint) -> bool:
        try:
            status, _ = await self.relay.get(self._upstream_for(endpoint), self.ready_path, timeout=10.0)
        except (UpstreamConnectionError, OSError, TimeoutError):
            return False
        return status == 200

    def _upstream_for(self, endpoint: Endpoint) -> Upstream:
        return Upstream(endpoint.base_url, endpoint.api_key or None, model=self.upstream_model, ask_usage=self.ask_usage)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "container_image": self.container_image}
