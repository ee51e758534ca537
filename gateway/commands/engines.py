"""`enginegate engines install llama-server`: build llama.cpp's server from the vendored tree.

PyPI carries no llama-server binary, but the llama-cpp-python sdist vendors the whole
llama.cpp tree (`vendor/llama.cpp`, `tools/server` included). This command downloads that
sdist through pip, configures it with the portable CPU flags of
`gateway/llamacpp_flags.py` (never -march=native, never AMX), builds only the
`llama-server` target, and installs one static binary into the cache:
`$ENGINEGATE_CACHE/bin/llama-server` (default `~/.cache/enginegate`). A stamp file beside
the binary records the version and flags, so a second run with the same inputs is a no-op.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from adapters.paths import bin_dir, cache_dir
from gateway.llamacpp_flags import host_cmake_args

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
ENGINES = ("llama-server",)
_EXTRA_CMAKE_ARGS = ("-DLLAMA_BUILD_SERVER=ON", "-DBUILD_SHARED_LIBS=OFF", "-DCMAKE_BUILD_TYPE=Release")


def cached_binary(name: str = "llama-server") -> Path:
    return bin_dir() / name


@dataclass(frozen=True, slots=True)
class BuildSpec:
    version: str
    cmake_args: tuple[str, ...]

    @property
    def stamp(self) -> dict[str, object]:
        return {"llama_cpp_python": self.version, "cmake_args": list(self.cmake_args)}

    @property
    def key(self) -> str:
        raw = json.dumps(self.stamp, sort_keys=True).encode()
        return hashlib.sha256(raw).hexdigest()[:12]


def stamp_path(binary: Path) -> Path:
    return binary.with_name(binary.name + ".json")


def is_installed(binary: Path, spec: BuildSpec) -> bool:
    stamp = stamp_path(binary)
    if not (binary.is_file() and os.access(binary, os.X_OK) and stamp.is_file()):
        return False
    try:
        return json.loads(stamp.read_text()) == spec.stamp
    except (OSError, ValueError):
        return False


def _say(message: str) -> None:
    print(f"[enginegate] {message}", flush=True)


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    """Run a build step with its output shown as it comes (cmake prints [NN%] progress)."""
    _say("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, cwd=cwd)
    if proc.returncode != 0:
        raise RuntimeError(f"command failed with exit code {proc.returncode}: {' '.join(cmd)}")


def fetch_sources(spec: BuildSpec, work: Path) -> Path:
    """Download the llama-cpp-python sdist (through pip) and unpack vendor/llama.cpp."""
    src_root = work / f"llama_cpp_python-{spec.version}"
    tree = src_root / "vendor" / "llama.cpp"
    if (tree / "CMakeLists.txt").is_file():
        _say(f"sources already unpacked: {tree}")
        return tree
    sdist_dir = work / "sdist"
    tarball = sdist_dir / f"llama_cpp_python-{spec.version}.tar.gz"
    if not tarball.is_file():
        _say(f"downloading llama-cpp-python=={spec.version} sdist (vendors llama.cpp)")
        _run([
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            f"llama-cpp-python=={spec.version}", "-d", str(sdist_dir),
        ])
    _say(f"unpacking {tarball.name}")
    with tarfile.open(tarball) as tar:
        tar.extractall(work, filter="data")
    if not (tree / "CMakeLists.txt").is_file():
        raise RuntimeError(f"the sdist has no vendored llama.cpp at {tree}")
    return tree


def install_llama_server(jobs: int, force: bool = False) -> Path:
    spec = BuildSpec(LLAMA_CPP_PYTHON_VERSION, tuple(host_cmake_args()) + _EXTRA_CMAKE_ARGS)
    binary = cached_binary()
    if not force and is_installed(binary, spec):
        _say(f"llama-server already installed: {binary} (same version and flags)")
        return binary
    if shutil.which("cmake") is None:
        raise RuntimeError("cmake is not installed; install cmake and a C++ compiler first")
    work = cache_dir() / "build"
    work.mkdir(parents=True, exist_ok=True)
    tree = fetch_sources(spec, work)
    build = work / f"build-{spec.key}"
    _say("CPU flags: " + " ".join(a for a in spec.cmake_args if a.startswith("-DGGML_")))
    configure = ["cmake", "-S", str(tree), "-B", str(build), *spec.cmake_args]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    _run(configure)
    _run(["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)])
    built = build / "bin" / "llama-server"
    if not built.is_file():
        raise RuntimeError(f"build finished but {built} is missing")
    binary.parent.mkdir(parents=True, exist_ok=True)
    tmp = binary.with_name(binary.name + ".tmp")
    shutil.copy2(built, tmp)
    os.replace(tmp, binary)
    stamp_path(binary).write_text(json.dumps(spec.stamp, indent=2))
    _say(f"installed {binary}")
    return binary


def _install(args: argparse.Namespace) -> int:
    if args.engine != "llama-server":
        print(f"unknown engine {args.engine!r}; installable: {', '.join(ENGINES)}", file=sys.stderr)
        return 2
    try:
        install_llama_server(jobs=args.jobs or os.cpu_count() or 2, force=args.force)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"install failed: {exc}", file=sys.stderr)
        return 1
    return 0


def _where(args: argparse.Namespace) -> int:
    from adapters.llama_server import find_llama_server

    found = find_llama_server(None)
    if found is None:
        print("llama-server not found (PATH, cache); run: enginegate engines install llama-server", file=sys.stderr)
        return 1
    print(found)
    return 0


def _logs(args: argparse.Namespace) -> int:
    from adapters.paths import logs_dir

    files = sorted(logs_dir().glob("*.log")) if logs_dir().is_dir() else []
    if args.model is None:
        for path in files:
            print(path)
        return 0 if files else 1
    matches = [p for p in files if p.name.startswith((f"{args.model}.", f"{args.model}-embed."))]
    if not matches:
        print(f"no engine log for {args.model!r} in {logs_dir()}", file=sys.stderr)
        return 1
    for path in matches:
        with path.open("r", encoding="utf-8", errors="replace") as f:
            tail = collections.deque(f, maxlen=args.lines)
        print(f"==> {path} <==")
        sys.stdout.writelines(tail)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    engines = subparsers.add_parser("engines", help="install and locate engine servers")
    sub = engines.add_subparsers(dest="engines_command", required=True)
    install = sub.add_parser("install", help="build an engine server into the cache")
    install.add_argument("engine", choices=ENGINES)
    install.add_argument("-j", "--jobs", type=int, help="parallel compile jobs (default: the CPU count)")
    install.add_argument("--force", action="store_true", help="rebuild even if the cached binary matches")
    install.set_defaults(func=_install)
    where = sub.add_parser("where", help="print the llama-server binary the gateway would use")
    where.set_defaults(func=_where)
    logs = sub.add_parser("logs", help="the last lines of an engine server's log (no MODEL: list the logs)")
    logs.add_argument("model", nargs="?", help="served model id")
    logs.add_argument("-n", "--lines", type=int, default=50)
    logs.set_defaults(func=_logs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="enginegate")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
