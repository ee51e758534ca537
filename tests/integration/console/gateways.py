"""The gateway the console's browser tests drive: the embedded model (in-process llama.cpp) behind
config-file keys: an admin, a user, and a user limited to one request a minute."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.gateway_process import RunningGateway, gateway

ADMIN_KEY = "console-admin-secret-4f1c"
USER_KEY = "console-user-secret-8a2d"
SLOW_KEY = "console-slow-secret-c3e9"  # rpm 1: its second request in a minute gets 429 with Retry-After
MODEL = "smollm2-135m-instruct"


@contextmanager
def keyed_gateway() -> Iterator[RunningGateway]:
    state = Path(tempfile.mkdtemp(prefix="enginegate-console-"))
    yaml = (f"api_keys:\n  - {{key: {ADMIN_KEY}, role: admin, name: ops}}\n"
            f"  - {{key: {USER_KEY}, name: alice}}\n"
            f"  - {{key: {SLOW_KEY}, name: slowpoke, rpm: 1}}\n"
            f"tenancy: {{path: \"{state / 'keys.sqlite3'}\"}}\n"
            f"response_store: {{path: \"{state / 'responses.sqlite3'}\"}}\n")
    with gateway(config_yaml=yaml) as running:
        yield running
