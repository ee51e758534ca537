"""vLLM's LoRA serving, as its source (0.32, vllm/entrypoints/openai/models/serving.py and serve/lora/api_router.py)
behaves, for the emulator:

- `--enable-lora --lora-modules name=path ...` registers adapters at start; `/v1/models` lists each with
  `root` (its path) and `parent` (the base); a request whose `model` is a registered adapter is answered under
  the adapter's name; an unknown one is 404 `The model `x` does not exist.`.
- With `VLLM_ALLOW_RUNTIME_LORA_UPDATING` set, `POST /v1/load_lora_adapter {lora_name, lora_path}` answers 200
  with the text `Success: LoRA adapter 'x' added successfully.`; a missing field 400 (InvalidUserInput), the
  base's name 400, a name already loaded 400 (`has already been loaded`), a path with no adapter 404
  (NotFoundError, `Loading lora x failed: No adapter found for p`). `POST /v1/unload_lora_adapter {lora_name}`:
  200 `Success: LoRA adapter 'x' removed successfully.`, an unknown name 404 (`cannot be found`). Without the
  variable neither route exists (404).
- `--max-loras` adapters run in one batch and `--max-cpu-loras` are cached; vLLM itself does not refuse more
  registrations, so neither does this. The emulator records every load (refused ones too) and unload and the most adapters it ever
  had registered at once, read by tests at `GET /emulator/loras`.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def _error(status: int, message: str, err_type: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": err_type, "param": None, "code": status}},
                             status=status)


@dataclass
class VllmLoras:
    base: str
    registered: dict[str, str] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    peak: int = 0
    load_seconds: float = 0.0
    """How long a load takes (vLLM reads the adapter's weights before it answers)."""

    @classmethod
    def from_modules(cls, base: str, modules: tuple[str, ...], load_seconds: float = 0.0) -> VllmLoras:
        out = cls(base, load_seconds=load_seconds)
        for module in modules:
            name, _, path = module.partition("=")
            out.registered[name] = path
        out.peak = len(out.registered)
        return out

    @staticmethod
    def runtime_allowed() -> bool:
        return os.environ.get(RUNTIME_ENV, "").lower() in ("1", "true")

    def routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/emulator/loras", self.inspect)
        if self.runtime_allowed():
            router.add_post("/v1/load_lora_adapter", self.load)
            router.add_post("/v1/unload_lora_adapter", self.unload)

    def knows(self, model: str) -> bool:
        return model in self.registered

    def entries(self, created: int) -> list[dict[str, object]]:
        return [{"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": path,
                 "parent": self.base} for name, path in self.registered.items()]

    async def inspect(self, request: web.Request) -> web.Response:
        return web.json_response({"registered": sorted(self.registered), "calls": self.calls, "peak": self.peak})

    async def load(self, request: web.Request) -> web.Response:
        body = await request.json()
        name, path = str(body.get("lora_name") or ""), str(body.get("lora_path") or "")
        if not name or not path:
            return _error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        self.calls.append(f"load {name}")  # every attempt, refused or not
        await asyncio.sleep(self.load_seconds)
        if name == self.base:
            return _error(400, f"The lora adapter '{name}' conflicts with a served base model.", "InvalidUserInput")
        if name in self.registered and not body.get("load_inplace"):
            return _error(400, f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                          "in place, set 'load_inplace' to True.", "InvalidUserInput")
        if not (Path(path) / "adapter_config.json").is_file():
            return _error(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
        self.registered[name] = path
        self.peak = max(self.peak, len(self.registered))
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(self, request: web.Request) -> web.Response:
        body = await request.json()
        name = str(body.get("lora_name") or "")
        if not name:
            return _error(400, "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput")
        if name not in self.registered:
            return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        self.calls.append(f"unload {name}")
        del self.registered[name]
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")
