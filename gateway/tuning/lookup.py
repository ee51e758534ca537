"""Read the tune cache for one plan: the matching record, the calibration figures, and why others were left out."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gateway.hardware import HardwareSnapshot
from gateway.planning.workload import Workload
from gateway.tuning.apply import Tuning
from gateway.tuning.fingerprint import engine_version, host_fingerprint, model_identity
from gateway.tuning.record import TuneRecord, load_all

Versions = Callable[[str], str | None]


def stale_because(record: TuneRecord, host: HardwareSnapshot, versions: Versions) -> str | None:
    """Why a record does not hold here (other hardware, other engine versions); None when it does."""
    here = host_fingerprint(host)
    if record.host != here:
        return "other hardware (" + "; ".join(here.differences(record.host)) + ")"
    measured = {r.engine for r in record.results if r.ok}
    changed = [f"{e} {record.engine_versions.get(e)!r} -> {versions(e)!r}" for e in sorted(measured)
               if record.engine_versions.get(e) != versions(e)]
    return "other engine version (" + "; ".join(changed) + ")" if changed else None


def lookup(snapshot: HardwareSnapshot, model: Path, workload: Workload, directory: Path | None = None,
           versions: Versions = engine_version) -> Tuning:
    """Never raises for the cache's sake: an unreadable cache is a note, and the plan stands as predicted."""
    try:
        records, notes = load_all(directory)
        identity = model_identity(model) if Path(model).exists() else None  # a ModelSpec JSON: no file to match
    except OSError as exc:
        return Tuning(notes=(f"tune cache not read: {exc}",))
    cache: dict[str, str | None] = {}

    def version(engine: str) -> str | None:
        if engine not in cache:
            cache[engine] = versions(engine)
        return cache[engine]

    matched: tuple[Path, TuneRecord] | None = None
    usable: list[TuneRecord] = []
    for path, record in records:
        same = identity is not None and record.model.digest == identity.digest and record.workload == workload
        why = stale_because(record, snapshot, version)
        if why is not None:
            if same:
                notes.append(f"tune record {path} ({record.created}) ignored: {why}; run `enginegate tune` again")
            continue
        usable.append(record)
        if same and matched is None:
            matched = (path, record)
    return Tuning(record=matched[1] if matched else None, path=str(matched[0]) if matched else None,
                  notes=tuple(notes), usable=tuple(record.results for record in usable))
