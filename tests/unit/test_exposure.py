"""Start-up warnings about what a configuration exposes (issue 32, item 7)."""

from __future__ import annotations

import pytest

from gateway.config import Settings
from gateway.exposure import exposure_warnings, is_loopback


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("LOCALHOST", True), ("0.0.0.0", False), ("::", False), ("", False), ("10.0.0.5", False),
    ("gateway.example.com", False), ("127.0.0.1.example.com", False),
])
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(("settings", "keys_on", "says"), [
    ({"host": "127.0.0.1"}, False, []),
    ({"host": "0.0.0.0"}, False, ["no API keys and listening on 0.0.0.0"]),
    ({"host": "0.0.0.0"}, True, []),
    ({"host": "::"}, False, ["no API keys and listening on ::"]),
    ({"tenancy": {"key_metrics": True}}, True, ["tenancy.key_metrics is on and /metrics needs no key"]),
    ({"tenancy": {"key_metrics": True}, "metrics_api_key": "m"}, True, []),
    ({"host": "0.0.0.0", "tenancy": {"key_metrics": True}}, False,
     ["no API keys and listening on 0.0.0.0", "tenancy.key_metrics is on and /metrics needs no key"]),
])
def test_warnings(settings: dict[str, object], keys_on: bool, says: list[str]) -> None:
    warnings = exposure_warnings(Settings(**settings), keys_on)  # type: ignore[arg-type]
    assert len(warnings) == len(says)
    for warning, start in zip(warnings, says, strict=True):
        assert warning.startswith(start)


def test_the_no_keys_warning_says_the_risk_and_the_fix() -> None:
    [warning] = exposure_warnings(Settings(host="0.0.0.0", port=8000), keys_on=False)
    assert "port 8000" in warning and "/admin/*" in warning and "enginegate keys create ops --role admin" in warning
