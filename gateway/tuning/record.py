"""Tune records: one JSON file per host, model and workload in the tune cache.

The cache is `$ENGINEGATE_TUNE_DIR`, else `<enginegate cache>/tune` (`~/.cache/enginegate/tune`).
A record is used only on the hardware it was measured on and with the engine versions it measured;
`load_all` reads every record here and says why each one that cannot be read or used is left out.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from adapters.paths import cache_dir
from gateway.planning.measured import VariantResult
from gateway.planning.workload import Workload
from gateway.tuning.fingerprint import HostFingerprint, ModelIdentity

TUNE_DIR_ENV = "ENGINEGATE_TUNE_DIR"
SCHEMA = 1


def tune_dir() -> Path:
    env = os.environ.get(TUNE_DIR_ENV)
    return Path(env).expanduser() if env else cache_dir() / "tune"


def workload_digest(w: Workload) -> str:
    return hashlib.sha256(w.model_dump_json().encode()).hexdigest()[:12]


class TuneRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    schema_version: int = SCHEMA
    created_at: float = Field(default_factory=time.time)
    host: HostFingerprint
    model: ModelIdentity
    workload: Workload
    slo: dict[str, float | None] = Field(default_factory=dict)
    """Goodput limits in seconds: ttft, tpot, e2e (null: none)."""
    engine_versions: dict[str, str | None] = Field(default_factory=dict)
    planned: dict[str, Any] = Field(default_factory=dict)
    """The plan's engine and options when tune ran."""
    results: tuple[VariantResult, ...] = ()
    """Ranked: measured variants best first, then those that failed, were not installed or were skipped."""
    budget_s: float = 0.0
    wall_s: float = 0.0

    @property
    def created(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.created_at))

    @property
    def winner(self) -> VariantResult | None:
        return next((r for r in self.results if r.ok), None)

    def file_name(self) -> str:
        return f"{self.model.digest}-{workload_digest(self.workload)}-{self.host.digest}.json"


def save(record: TuneRecord, directory: Path | None = None) -> Path:
    """Write atomically (a reader never sees half a record); replaces the same host/model/workload's record."""
    directory = directory or tune_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / record.file_name()
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(record.model_dump_json(indent=2))
    tmp.replace(path)
    return path


def load_all(directory: Path | None = None) -> tuple[list[tuple[Path, TuneRecord]], list[str]]:
    """Every readable record, newest first, and a note for each file that is not one."""
    directory = directory or tune_dir()
    records: list[tuple[Path, TuneRecord]] = []
    notes: list[str] = []
    if not directory.is_dir():
        return records, notes
    for path in sorted(directory.glob("*.json")):
        try:
            records.append((path, TuneRecord.model_validate_json(path.read_bytes())))
        except (OSError, ValidationError, ValueError) as exc:
            first = str(exc).splitlines()[0]
            notes.append(f"tune record {path} ignored: not a record of this version ({first})")
    records.sort(key=lambda item: item[1].created_at, reverse=True)
    return records, notes
