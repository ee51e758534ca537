"""What a tune record is valid for: this host's hardware, this model's file, each engine's version."""

from __future__ import annotations

import functools
import hashlib
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from adapters import registry
from gateway.hardware import HardwareSnapshot

HEAD_BYTES = 1 << 20
"""A model file is known by its size and the hash of its first MiB (a GGUF's header and metadata)."""


class HostFingerprint(BaseModel):
    """The hardware facts that decide speed; probes that vary run to run (free memory, measured
    bandwidth) are left out, so a record stays valid on the same machine."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    cpu: str
    architecture: str
    logical_cores: int | None
    instruction_sets: tuple[str, ...]
    memory_gib: int | None
    gpus: tuple[str, ...] = ()
    driver: str | None = None

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]

    def differences(self, other: HostFingerprint) -> list[str]:
        mine, theirs = self.model_dump(), other.model_dump()
        return [f"{k} {theirs[k]!r} -> {mine[k]!r}" for k in mine if mine[k] != theirs[k]]


def host_fingerprint(s: HardwareSnapshot) -> HostFingerprint:
    gpus: list[str] = []
    if s.nvidia:
        gpus += [f"{g.name} {round((g.memory_total_bytes or 0) / 2**30)} GiB" for g in s.nvidia.gpus]
    if s.amd:
        gpus += [f"{g.name} {round((g.memory_total_bytes or 0) / 2**30)} GiB" for g in s.amd.gpus]
    if s.apple:
        gpus.append(f"{s.apple.chip} {s.apple.gpu_cores or '?'} cores")
    return HostFingerprint(
        cpu=s.cpu.model or "unknown",
        architecture=s.cpu.architecture,
        logical_cores=s.cpu.logical_cores,
        instruction_sets=tuple(sorted(s.cpu.instruction_sets)),
        memory_gib=None if s.memory.total_bytes is None else round(s.memory.total_bytes / 2**30),
        gpus=tuple(gpus),
        driver=s.nvidia.driver_version if s.nvidia else None,
    )


class ModelIdentity(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    path: str
    digest: str
    """Size and content hash: the same file elsewhere (another venv, another checkout) matches."""


def model_identity(path: Path) -> ModelIdentity:
    path = Path(path)
    h = hashlib.sha256()
    if path.is_dir():
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(f"{f.relative_to(path)}:{f.stat().st_size}\n".encode())
        config = path / "config.json"
        if config.is_file():
            h.update(config.read_bytes())
    else:
        h.update(str(path.stat().st_size).encode())
        with path.open("rb") as fh:
            h.update(fh.read(HEAD_BYTES))
    return ModelIdentity(name=path.stem if path.is_file() else path.name, path=str(path), digest=h.hexdigest()[:16])


def engine_version(engine: str) -> str | None:
    """The installed engine's version: its Python distribution's, or its program's `--version`; None if absent."""
    spec = registry.spec(engine)
    if engine == "llama_server":
        from adapters.llama_server import find_llama_server  # noqa: PLC0415 - one engine's binary lookup

        binary = find_llama_server(None)
        return None if binary is None else _program_version(str(binary), binary.stat().st_mtime)
    for module in spec.python_modules:
        dist = _distributions().get(module.split(".")[0])
        for name in dist or ():
            try:
                return f"{name} {metadata.version(name)}"
            except metadata.PackageNotFoundError:
                continue
    for program in spec.programs:
        found = shutil.which(program)
        if found:
            return _program_version(found, Path(found).stat().st_mtime)
    return None


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return dict(metadata.packages_distributions())


@functools.lru_cache(maxsize=32)
def _program_version(program: str, mtime: float) -> str | None:
    """First line of `program --version` that names a version (cached per binary and modification time)."""
    try:
        done = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return next((line for line in lines if "version" in line.lower()), lines[0] if lines else None)
