"""The console: the static web UI the gateway serves at `/` (playground, models, keys, requests, status)."""

from gateway.console.serving import CSP, router

__all__ = ["CSP", "router"]
