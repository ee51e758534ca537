"""ExLlamaV3 and ExLlamaV2 through TabbyAPI, launched and supervised (engines `exllamav3`, `exllamav2`).

TabbyAPI is a checkout, not a package: `options.tabby_dir` names it (or `options.executable`
replaces `python <tabby_dir>/main.py`). This adapter writes a `config.yml` (network, model,
cache mode, tensor parallel) and an `api_tokens.yml` (API and admin keys) into a run directory
of its own and starts TabbyAPI there, so the user's checkout is never written to. TabbyAPI loads
the model before it binds its port, so the port opening and `/health` answering 200 is readiness.
Errors are FastAPI's `{"detail": ...}`; streams are sse-starlette (`\\r\\n`, pings); the relay
handles both. TabbyAPI has no Prometheus endpoint.

ExLlamaV2: TabbyAPI's main branch dropped it on 2026-07-14. EXL2 models run on a TabbyAPI
checkout from before that date (pinned by the operator: `git checkout <commit before
2026-07-14>`), with `backend: exllamav2` in its config; `exllamav2` names that checkout with
`options.tabby_dir`. ExLlamaV3 needs CUDA compute capability >= 8.0 (Ampere or newer).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from adapters.base import Capabilities, EngineError
from adapters.config import EngineConfig
from adapters.engine_server import EngineServer
from adapters.launch import LaunchOptions, server_layout_options
from adapters.process import Endpoint, Launch
from adapters.spec import EngineSpec, Layout, ServerSpec, missing_package

CACHE_MODES = {None: "FP16", "auto": "FP16", "fp16": "FP16", "q8": "Q8", "q6": "Q6", "q4": "Q4",
               "fp8": "Q8", "int8": "Q8", "int4": "Q4"}
EXLLAMA_KV_DTYPE = {"fp16": "fp16", "bf16": "fp16", "fp8": "q8", "q8_0": "q8", "q4_0": "q4"}
"""The planner's KV dtype in TabbyAPI's cache modes (lower case, as options.kv_cache_dtype takes them)."""


def cache_mode(kv_cache_dtype: str | None) -> str:
    key = kv_cache_dtype.lower() if kv_cache_dtype else None
    if key not in CACHE_MODES:
        raise EngineError(f"options.kv_cache_dtype {kv_cache_dtype!r} has no TabbyAPI cache mode; use one of "
                          "fp16, q8, q6, q4", 503, "invalid_engine_options")
    return CACHE_MODES[key]


def tabby_config(model_path: str, served: str, opts: LaunchOptions, endpoint: Endpoint, backend: str) -> dict[str, Any]:
    """TabbyAPI's config.yml for one model."""
    path = Path(model_path)
    model: dict[str, Any] = {
        "model_dir": str(path.parent),
        "model_name": path.name,
        "backend": backend,
        "cache_mode": cache_mode(opts.kv_cache_dtype),
        "tensor_parallel": opts.tensor_parallel > 1,
        "gpu_split_auto": True,
    }
    if opts.context_length:
        model["max_seq_len"] = opts.context_length
        model["cache_size"] = opts.context_length
    return {
        "network": {"host": endpoint.host, "port": endpoint.port, "disable_auth": not endpoint.api_key,
                    "api_servers": ["OAI"]},
        "logging": {"log_prompt": False, "log_generation_params": False, "log_requests": False},
        "model": model,
    }


def tabby_tokens(api_key: str, admin_key: str) -> dict[str, str]:
    return {"api_key": api_key, "admin_key": admin_key}


def tabby_missing(spec: EngineSpec, options: Mapping[str, Any]) -> str | None:
    """TabbyAPI is a checkout, not a package: installed means options.tabby_dir names one (or an executable)."""
    if options.get("executable"):
        return missing_package(spec, options)
    if not options.get("tabby_dir"):
        return f"the {spec.name} engine runs through TabbyAPI, and options.tabby_dir is not set: {spec.install_hint}"
    tabby_dir = Path(str(options["tabby_dir"])).expanduser()
    if not (tabby_dir / "main.py").is_file():
        return f"options.tabby_dir {str(tabby_dir)!r} is not a TabbyAPI checkout (no main.py): {spec.install_hint}"
    return None


class TabbyAdapter(EngineServer):
    def __init__(self, config: EngineConfig, spec: EngineSpec) -> None:
        super().__init__(config, spec)
        self.backend = spec.name
        self.tabby_dir = Path(str(self.options["tabby_dir"])).expanduser() if self.options.get("tabby_dir") else None
        self.admin_key = secrets.token_urlsafe(24)

    def check(self) -> None:
        super().check()
        need = self.spec.min_compute_capability
        have = _compute_capability(self.options.get("compute_capability"))
        if need is not None and have is not None and have[0] + have[1] / 10 < need:
            raise EngineError(
                f"{self.engine} needs CUDA compute capability >= {need:.1f}; this GPU has {have[0]}.{have[1]}"
                + (" (use exllamav2, or the llamacpp engine with a GGUF model)" if self.engine == "exllamav3" else ""),
                503, "unsupported_hardware",
            )

    def command(self, endpoint: Endpoint) -> Launch:
        run_dir = self.run_dir()
        config = tabby_config(self.model_path, self.served, self.launch_options, endpoint, self.backend)
        config_file = run_dir / "config.yml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        (run_dir / "api_tokens.yml").write_text(yaml.safe_dump(tabby_tokens(endpoint.api_key, self.admin_key)))
        if self.launch_options.executable:
            program = list(self.launch_options.executable)
        else:
            assert self.tabby_dir is not None
            program = [self.launch_options.python, str(self.tabby_dir / "main.py")]
        return Launch([*program, "--config", str(config_file)], cwd=str(run_dir))


def layout_options(lay: Layout) -> dict[str, Any]:
    return server_layout_options(lay, EXLLAMA_KV_DTYPE)


def _compute_capability(value: Any) -> tuple[int, int] | None:
    """From the plan/config (`"8.6"`, `8.6`, `[8, 6]`); the planner fills it from the host's snapshot."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return int(value[0]), int(value[1])
    major, _, minor = str(value).partition(".")
    return int(major), int(minor or 0)


_TABBY = ServerSpec(ready_path="/health", metrics_path=None, startup_timeout=900.0)

EXLLAMAV3 = EngineSpec(
    name="exllamav3",
    adapter=TabbyAdapter,
    capabilities=Capabilities(chat=True, completions=True, embeddings=False, tools=True, structured_output=True,
                              logprobs=True, image_input=True),
    accelerators=("nvidia",),
    formats=("exl3", "exl2", "gptq"),
    min_compute_capability=8.0,  # Ampere or newer
    install_hint=("clone TabbyAPI (git clone https://github.com/theroyallab/tabbyAPI), install it "
                  "(pip install -e '.[cu12]' in its directory; NVIDIA GPU) and set options.tabby_dir to the checkout"),
    missing=tabby_missing,
    layout_options=layout_options,
    default_concurrency=64,
    container_image="ghcr.io/theroyallab/tabbyapi:latest",
    server=_TABBY,
)

EXLLAMAV2 = replace(
    EXLLAMAV3,
    name="exllamav2",
    accelerators=("nvidia", "amd"),
    formats=("exl2", "gptq"),
    min_compute_capability=6.0,
    install_hint=("clone TabbyAPI and check out a commit from before 2026-07-14, when main dropped ExLlamaV2 "
                  "(git clone https://github.com/theroyallab/tabbyAPI && git -C tabbyAPI checkout "
                  "$(git -C tabbyAPI rev-list -1 --before=2026-07-14 HEAD)), install it and set options.tabby_dir"),
    container_image=None,  # no maintained image ships the exllamav2 backend: build one from the pinned checkout
)
