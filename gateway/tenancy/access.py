"""Which role each route needs: the one table that auth enforces, the README documents and the
route-by-route test reads.

With keys configured (in the config file or the key store): `user` routes need any valid key,
`admin` routes a key with role admin (a user key gets 403), `metrics` routes the metrics_api_key
when one is set, `public` routes nothing. /ready is public but shows the engines' process ids,
ports and URLs only to an admin key. With no keys at all every route is open, as before."""

from __future__ import annotations

from typing import Literal

Access = Literal["public", "user", "admin", "metrics"]

ROUTE_ACCESS: tuple[tuple[str, Access], ...] = (
    ("/admin/requests", "user"),     # recent requests: each key sees its own tenant's, an admin key all (gateway/recent)
    ("/admin/", "admin"),            # keys, usage, limits, engines and their logs, model load/unload
    ("/v1/gateway/plan", "admin"),   # the host's hardware, the plans, launch options
    ("/v1/", "user"),                # the OpenAI and Anthropic APIs, /v1/models, /v1/gateway/stats
    ("/tokenize", "user"),           # vLLM's tokenizer routes (lm-eval's remote tokenizer calls them at the root)
    ("/detokenize", "user"),
    ("/tokenizer_info", "user"),
    ("/metrics", "metrics"),         # metrics_api_key, when set
)
"""Path prefix -> access, first match wins; every other path (/health, /ready, /, /docs, /openapi.json) is public."""


def required_access(path: str) -> Access:
    for prefix, access in ROUTE_ACCESS:
        if path.startswith(prefix):
            return access
    return "public"
