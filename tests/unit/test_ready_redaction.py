"""/ready is open to anyone who can reach the gateway: engine process ids, ports and URLs only
with an admin key (a user key sees what anyone sees)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from adapters.base import Health
from gateway.app import create_app
from gateway.config import Settings
from gateway.runtime import runtime_for_adapters
from tests.fakes import EchoAdapter

DETAIL = "ready: pid 4242 on port 38111 (upstream http://10.0.0.7:8000/v1)"


class ServerLike(EchoAdapter):
    async def health(self) -> Health:
        return Health(ready=True, detail=DETAIL)


def test_ready_hides_process_ids_ports_and_urls_without_an_admin_key() -> None:
    settings = Settings(api_keys=("user-key", {"key": "operator-key", "role": "admin"}))
    with TestClient(create_app(settings, runtime_for_adapters(settings, {"echo": ServerLike()}))) as client:
        public = client.get("/ready")
        operator = client.get("/ready", headers={"Authorization": "Bearer operator-key"})
        wrong = client.get("/ready", headers={"Authorization": "Bearer guess"})
        user = client.get("/ready", headers={"Authorization": "Bearer user-key"})
    assert public.status_code == operator.status_code == 200
    shown = public.json()["models"]["echo"]["detail"]
    assert "4242" not in shown and "38111" not in shown and "10.0.0.7" not in shown
    assert shown.startswith("ready: pid * on port *")
    assert wrong.json() == public.json() == user.json()
    assert operator.json()["models"]["echo"]["detail"] == DETAIL
