"""The tune cache: where it is, which record matches, and why a record is left out."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.modelsource import embedded_model_path
from gateway.planning import Workload
from gateway.tuning import TUNE_DIR_ENV, lookup, tune_dir
from gateway.tuning.record import load_all, save
from tests.unit.hosts import host
from tests.unit.tuning.helpers import SNAPSHOT, WORKLOAD, planned, record, result

MODEL = embedded_model_path()


def v1(engine: str) -> str:
    return "v1"


def _saved(tmp_path: Path, **kw) -> Path:  # type: ignore[no-untyped-def]
    rec = record([result("llama_server", planned().options, goodput=1.0)], **kw)
    return save(rec, tmp_path)


def test_the_cache_dir_is_overridable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(TUNE_DIR_ENV, str(tmp_path / "t"))
    assert tune_dir() == tmp_path / "t"
    monkeypatch.delenv(TUNE_DIR_ENV)
    assert tune_dir().parts[-2:] == ("enginegate", "tune")


def test_a_record_for_this_host_model_and_workload_matches(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    found = lookup(SNAPSHOT, MODEL, WORKLOAD, tmp_path, versions=v1)
    assert found.record is not None and found.path == str(path)
    assert found.notes == () and len(found.usable) == 1


def test_another_workloads_record_only_calibrates(tmp_path: Path) -> None:
    _saved(tmp_path)
    found = lookup(SNAPSHOT, MODEL, Workload(), tmp_path, versions=v1)
    assert found.record is None and len(found.usable) == 1 and found.notes == ()


def test_a_record_from_other_hardware_is_ignored_with_a_note(tmp_path: Path) -> None:
    _saved(tmp_path, snapshot=host("rtx-3060"))
    found = lookup(SNAPSHOT, MODEL, WORKLOAD, tmp_path, versions=v1)
    assert found.record is None and found.usable == ()
    assert len(found.notes) == 1 and "ignored: other hardware (" in found.notes[0]
    assert "run `enginegate tune` again" in found.notes[0]


def test_a_record_of_another_engine_version_is_ignored_with_a_note(tmp_path: Path) -> None:
    _saved(tmp_path)
    found = lookup(SNAPSHOT, MODEL, WORKLOAD, tmp_path, versions=lambda e: "v2")
    assert found.record is None and found.usable == ()
    assert "other engine version (llama_server 'v1' -> 'v2')" in found.notes[0]


def test_an_unreadable_file_is_a_note_not_a_failure(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{not json")
    _saved(tmp_path)
    found = lookup(SNAPSHOT, MODEL, WORKLOAD, tmp_path, versions=v1)
    assert found.record is not None
    assert any("broken.json ignored" in n for n in found.notes)


def test_no_cache_dir_is_no_record(tmp_path: Path) -> None:
    found = lookup(SNAPSHOT, MODEL, WORKLOAD, tmp_path / "missing", versions=v1)
    assert found.record is None and found.notes == () and found.usable == ()


def test_a_new_record_replaces_the_old_one_and_newest_come_first(tmp_path: Path) -> None:
    first = _saved(tmp_path)
    second = _saved(tmp_path)
    assert first == second
    other = save(record([result("llama_server", planned().options, goodput=1.0)], workload=Workload()), tmp_path)
    records, notes = load_all(tmp_path)
    assert [p for p, _ in records][0] == other and len(records) == 2 and notes == []
