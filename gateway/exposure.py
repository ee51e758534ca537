"""What a configuration exposes to whoever can reach it: the start-up warnings (logged, and lines of
the start-up summary). Pure: the settings and whether keys are on in, sentences out. Nothing is
refused: the operator's explicit setting wins, and the warning says what it costs and how to close it."""

from __future__ import annotations

import ipaddress

from gateway.config import Settings


def is_loopback(host: str) -> bool:
    """Only this machine can connect: a loopback address or `localhost`; a wildcard (0.0.0.0, ::) or any
    other name may be reachable from the network."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def exposure_warnings(settings: Settings, keys_on: bool) -> list[str]:
    warnings = []
    if not keys_on and not is_loopback(settings.host):
        warnings.append(
            f"no API keys and listening on {settings.host}: anyone who can reach port {settings.port} may use every "
            "route, /admin/* included (create keys, unload models, read engine logs); create an admin key "
            "(`enginegate keys create ops --role admin`, or api_keys in the config) or listen on 127.0.0.1")
    if settings.tenancy.key_metrics and not settings.metrics_api_key:
        warnings.append(
            "tenancy.key_metrics is on and /metrics needs no key: anyone who can reach /metrics reads every "
            "tenant's key name and request counts; set metrics_api_key (ENGINEGATE_METRICS_API_KEY)")
    return warnings
