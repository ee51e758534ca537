"""EngineServer: the one adapter every server engine runs through, parameterised by its spec.

On top of `ServerAdapter` (ManagedProcess + relay) it adds: the unified launch options parsed
once (a bad value is reported at start as a 503 naming the option, never a stack trace), the
spec's install check (which names the install command), `extra_args`/`env` appended to every
launch, and a private run directory for the config files an engine is launched with.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from adapters.base import EngineError
from adapters.config import EngineConfig
from adapters.launch import LaunchConfigError, LaunchOptions, launch_options
from adapters.process import Endpoint, Launch
from adapters.server import ServerAdapter
from adapters.spec import EngineSpec


class EngineServer(ServerAdapter):
    def __init__(self, config: EngineConfig, spec: EngineSpec) -> None:
        super().__init__(config, spec)
        self._run_dir: Path | None = None
        self.model_path = config.source
        self.config_error: str | None = None
        try:
            self.launch_options = launch_options(self.options)
        except LaunchConfigError as exc:
            self.config_error = str(exc)
            self.launch_options = LaunchOptions()

    def run_dir(self, sub: str = "") -> Path:
        """A private folder (or a folder `sub` in it) for what an engine is launched with; removed on stop."""
        if self._run_dir is None:
            self._run_dir = Path(tempfile.mkdtemp(prefix=f"enginegate-{self.engine}-"))
        path = self._run_dir / sub if sub else self._run_dir
        path.mkdir(exist_ok=True)
        return path

    def remove_run_dir(self) -> None:
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            self.remove_run_dir()

    def command(self, endpoint: Endpoint) -> Launch:
        """The engine's command line for this endpoint (the spec's, without extra_args/env)."""
        if self.server.command is None:
            raise NotImplementedError(f"engine {self.engine!r} declares no launch command")
        return self.server.command(self, endpoint)

    def launch(self, endpoint: Endpoint) -> Launch:
        launch = self.command(endpoint)
        env = {**launch.env, **self.launch_options.env}
        argv = [*launch.argv, *self.launch_options.extra_args]
        return Launch(argv, env, launch.cwd)

    def missing_engine(self) -> str | None:
        """Why the engine cannot run here (and how to install it), or None if it looks installed."""
        return self.spec.why_missing(self.options)

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

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "container_image": self.container_image}
