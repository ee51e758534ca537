"""A third-party engine, registered only through the `enginegate.adapters` entry point, is planned,
started (against the engine emulator) and served by `enginegate serve` like a built-in.

The plugin is a package written into a temporary directory with its own `.dist-info` (so
`importlib.metadata` finds its entry point on `PYTHONPATH`); no file of the project changes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import openai
import pytest

from gateway.modelsource import embedded_model_path
from tests.gateway_process import REPO_ROOT, gateway

pytestmark = pytest.mark.integration

PLUGIN = textwrap.dedent('''
    """toy: an OpenAI-compatible engine server (here the project's engine emulator) as a plugin."""

    import sys

    from adapters.base import Capabilities
    from adapters.engine_server import EngineServer
    from adapters.process import Launch
    from adapters.spec import EngineSpec, ServerSpec


    def command(adapter, endpoint):
        argv = [sys.executable, "-m", "tests.emulators.engine_emulator", "--style", "vllm",
                "--host", endpoint.host, "--port", str(endpoint.port), "--model", adapter.served,
                "--tokens", "3", "--max-model-len", str(adapter.options["context_length"])]
        if endpoint.api_key:
            argv += ["--api-key", endpoint.api_key]
        return Launch(argv)


    SPEC = EngineSpec(
        name="toy",
        adapter=EngineServer,
        capabilities=Capabilities(chat=True, completions=True),
        accelerators=("none", "nvidia", "amd", "apple"),
        formats=("gguf",),
        needs_fast_memory=False,
        install_hint="pip install toy-engine",
        layout_options=lambda lay: {"context_length": lay.context_length, "max_concurrency": lay.concurrency},
        default_concurrency=8,
        server=ServerSpec(command=command, ready_path="/health",
                          metrics_map={"requests_running": "vllm:num_requests_running"}),
    )
''')


def install_plugin(root: Path) -> dict[str, str]:
    (root / "toy_engine").mkdir()
    (root / "toy_engine" / "__init__.py").write_text(PLUGIN)
    info = root / "toy_engine-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-engine\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[enginegate.adapters]\ntoy = toy_engine:SPEC\n")
    return {"PYTHONPATH": os.pathsep.join((str(REPO_ROOT), str(root)))}


def config(engine: str, **options: object) -> str:
    lines = [f"models:\n  - source: {embedded_model_path()}\n    name: toy-model\n    engine: {engine}"]
    if options:
        lines.append("    options:")
        lines += [f"      {k}: {v}" for k, v in options.items()]
    return "\n".join(lines) + "\n"


def test_a_plugin_engine_is_planned_started_and_served(tmp_path: Path) -> None:
    env = install_plugin(tmp_path)
    yaml_text = config("toy", log_dir=str(tmp_path / "logs"), context_length=1536)
    with gateway(env=env, config_yaml=yaml_text) as gw:
        plan = httpx.get(gw.url + "/v1/gateway/plan", timeout=10).json()["plans"]["toy-model"]
        assert plan["engine"] == "toy" and plan["rule"] == "requested"
        assert plan["options"]["context_length"] == 1536
        assert [o["option"] for o in plan["overridden"]] == ["context_length"]
        client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model="toy-model", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content and reply.usage and reply.usage.completion_tokens == 3
        engines = httpx.get(gw.url + "/admin/engines", timeout=10).json()
        assert engines["toy-model"]["engine"] == "toy" and engines["toy-model"]["state"] == "ready"
        assert 'enginegate_model_info{engine="toy",model="toy-model"' in gw.metrics()


def test_the_plan_command_knows_the_plugin(tmp_path: Path) -> None:
    env = {**os.environ, **install_plugin(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "gateway", "plan", "--engine", "toy"], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "toy" in out.stdout


def test_an_unknown_engine_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(config("nope"))
    out = subprocess.run([sys.executable, "-m", "gateway", "serve", "--config", str(tmp_path / "config.yaml"),
                          "--port", "0"], cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "unknown engine 'nope'" in out.stderr and "llamacpp" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr + out.stdout
