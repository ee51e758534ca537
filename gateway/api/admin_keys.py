"""Admin: keys and usage (admin role only, as every /admin route).

    GET  /admin/keys                    every key (never a secret or its hash)
    POST /admin/keys                    create one: {"name", "role", "models", "rpm", ...}; the answer holds the secret, once
                                        (not on a gateway with no key yet: the first one is made on the host)
    POST /admin/keys/{name}/revoke      the key fails on its next request, in every gateway sharing the store
    POST /admin/keys/{name}/rotate      a new secret for the same name (usage and limits carry on); the old one stops working
    POST /admin/keys/{name}/release-leases  end every concurrency slot the key holds (a reset: requests still
                                        running keep running, uncounted)
    GET  /admin/usage?key=&since=       usage per key, model and UTC day
    POST /admin/auth/disable            turn "keys are on" off again in the key store (409 while a key is active)
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import Field

from gateway.api.errors import APIError
from gateway.api.serving import parse_body
from gateway.identity import caller_of
from gateway.tenancy.keys import VALID_NAME, KeyPolicy, new_record, rotated
from gateway.tenancy.service import Tenancy
from gateway.tenancy.store import KeyExists, KeysActive, StoreUnavailable

router = APIRouter()


class NewKey(KeyPolicy):
    name: str = Field(pattern=VALID_NAME)


def _tenancy(request: Request) -> Tenancy:
    return request.app.state.tenancy  # type: ignore[no-any-return]


def _unavailable(_: StoreUnavailable) -> APIError:
    return APIError(503, "The key store is unreachable; try again shortly.", code="store_unavailable",
                    headers={"Retry-After": "1"})


def _not_found(name: str) -> APIError:
    return APIError(404, f"no active key named {name[:64]!r} in the key store", param="name", code="not_found")


@router.get("/admin/keys")
async def list_keys(request: Request) -> dict[str, Any]:
    t = _tenancy(request)
    try:
        stored = await t.store.list()
    except StoreUnavailable as exc:
        raise _unavailable(exc) from exc
    return {"object": "list", "data": [r.public() for r in [*t.static_names.values(), *stored]]}


@router.post("/admin/keys")
async def create_key(request: Request) -> dict[str, Any]:
    if caller_of(request.scope) is None:  # no key anywhere: a remote client may not be the one to turn auth on
        raise APIError(403, "This gateway has no keys yet: create the first admin key with `enginegate keys create NAME "
                            "--role admin` on its host, or in the config file's api_keys.", code="permission_denied")
    parsed, _ = await parse_body(request, NewKey)
    t = _tenancy(request)
    if parsed.name in t.static_names:
        raise APIError(409, f"{parsed.name!r} is a key in the config file", param="name", code="key_exists")
    record, secret = new_record(parsed.name, KeyPolicy.model_validate(parsed.model_dump(exclude={"name"})))
    try:
        await t.store.create(record)
    except KeyExists as exc:
        raise APIError(409, f"a key named {parsed.name!r} exists (revoke or rotate it)", param="name",
                       code="key_exists") from exc
    except StoreUnavailable as exc:
        raise _unavailable(exc) from exc
    return {**record.public(), "key": secret}


@router.post("/admin/keys/{name}/revoke")
async def revoke_key(request: Request, name: str) -> dict[str, Any]:
    try:
        record = await _tenancy(request).store.revoke(name, time.time())
    except StoreUnavailable as exc:
        raise _unavailable(exc) from exc
    if record is None:
        raise _not_found(name)
    return record.public()


@router.post("/admin/keys/{name}/rotate")
async def rotate_key(request: Request, name: str) -> dict[str, Any]:
    store = _tenancy(request).store
    try:
        current = await store.get(name)
        if current is None or current.revoked_at is not None:
            raise _not_found(name)
        record, secret = rotated(current)
        if await store.replace_secret(name, record.secret_hash) is None:
            raise _not_found(name)
    except StoreUnavailable as exc:
        raise _unavailable(exc) from exc
    return {**record.public(), "key": secret}


@router.post("/admin/keys/{name}/release-leases")
async def release_leases(request: Request, name: str) -> dict[str, Any]:
    tenancy = _tenancy(request)
    try:
        released = await tenancy.store.release_leases(name)
    except StoreUnavailable as exc:
        raise _unavailable(exc) from exc
    tenancy.leases_released(name)  # other gateways stop reusing theirs within LEASE_REUSE_S (docs/keys.md)
    return {"name": name, "released": released}


@router.post("/admin/auth/disable")
async def disable_auth(request: Request) -> dict[str, Any]:
    t = _tenancy(request)
    try:
        await t.disable_auth()
    except KeysActive as exc:
        raise APIError(409, f"the key {str(exc)[:64]!r} is active: revoke every key in the store first",
                       code="keys_active") from exc
    except StoreUnavailable as exc:
        raise _unavailable(exc) from exc
    return {"auth_enabled": await t.required(), "config_keys": len(t.static)}


@router.get("/admin/usage")
async def usage(request: Request, key: str | None = None,
                since: str | None = Query(default=None, pattern=r"^\d{4}-\d{2}-\d{2}$")) -> dict[str, Any]:
    try:
        rows = await _tenancy(request).store.usage(key, since)
    except StoreUnavailable as exc:
        raise _unavailable(exc) from exc
    return {"object": "list", "data": rows}
