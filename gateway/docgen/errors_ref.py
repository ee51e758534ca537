"""docs/reference/errors.md from adapters/error_codes.py."""

from __future__ import annotations

from adapters.error_codes import ERROR_CODES
from adapters.upstream_errors import error_type
from gateway.docgen.markdown import cell, table


def render() -> str:
    rows = []
    for entry in ERROR_CODES:
        statuses = ", ".join(str(s) for s in entry.statuses) or "stream event"
        types = ", ".join(dict.fromkeys(f"`{error_type(s)}`" for s in entry.statuses)) or "-"
        rows.append([f"`{entry.code}`", statuses, types, cell(entry.meaning)])
    return "\n".join([
        "# Error codes",
        "",
        "Every error the gateway sends has OpenAI's shape, `{\"error\": {\"message\", \"type\", \"param\", \"code\"}}`",
        "(on `/v1/messages`, Anthropic's `{\"type\": \"error\", \"error\": {\"type\", \"message\"}}`); `type` follows",
        "from the HTTP status. These are the `code`s the gateway itself writes, from `adapters/error_codes.py`",
        "(a test fails when the source sends a code that table lacks). Errors an engine returns are relayed",
        "with the engine's own code. See [the API](../api.md#errors) for when each status is sent.",
        "",
        table(["code", "HTTP status", "type", "meaning"], rows),
    ])
