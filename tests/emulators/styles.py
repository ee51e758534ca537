"""Per-engine quirks of the emulator: error shapes, SSE framing, readiness, metric names.

Each `Style` reproduces what /work/shared/engines.md documents for one engine's server.
The server in `engine_emulator` asks its style every question whose answer differs by engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

# How the server behaves while it is "loading" (the --startup-delay phase):
#   closed        the port is not bound until ready (vLLM, TabbyAPI, trtllm-serve)
#   503           bound; every route but /v1/models answers 503 (llama-server)
#   warmup        bound; /health, /health_generate, /ready 503, generation waits (SGLang)
#   health_ok     bound; /health 200 all along, generation waits for the load (mlx_lm.server)
#   models_empty  bound; /v1/models lists nothing and chat is a bare 404 (Dynamo frontend)
Loading = Literal["closed", "503", "warmup", "health_ok", "models_empty"]

Json = dict[str, Any]

# Generic metric keys -> (kind); each style names them its own way.
METRIC_KINDS: dict[str, str] = {
    "prompt_tokens": "counter",
    "generation_tokens": "counter",
    "requests": "counter",
    "running": "gauge",
    "waiting": "gauge",
    "ttft": "histogram",
    "itl": "histogram",
    "e2e": "histogram",
}


@dataclass(frozen=True)
class ErrorReply:
    status: int
    body: Json | None  # None: an empty body (Dynamo's bare 404)


class Style:
    name: ClassVar[str]
    default_port: ClassVar[int] = 8000
    owned_by: ClassVar[str]
    loading: ClassVar[Loading] = "closed"
    separator: ClassVar[bytes] = b"\n\n"
    # Prometheus text: path -> whether it needs --metrics; None: no Prometheus endpoint.
    metrics_path: ClassVar[str | None] = "/metrics"
    metrics_need_flag: ClassVar[bool] = False
    metric_names: ClassVar[dict[str, str]] = {}
    speculative_metric_names: ClassVar[dict[str, str]] = {}
    """Counters the engine exports only with speculative decoding on (key -> its metric name)."""
    metric_labels: ClassVar[tuple[str, ...]] = ()
    # Paths auth does not guard.
    public_paths: ClassVar[frozenset[str]] = frozenset({"/health", "/metrics"})
    accepts_x_api_key: ClassVar[bool] = False
    embeddings: ClassVar[bool] = True
    done_after_midstream_error: ClassVar[bool] = True

    # --- errors -------------------------------------------------------------------------
    def error_type(self, status: int) -> str:
        return {
            400: "BadRequestError",
            401: "AuthenticationError",
            404: "NotFoundError",
            429: "RateLimitError",
            501: "NotImplementedError",
            503: "ServiceUnavailableError",
        }.get(status, "InternalServerError")

    def error(self, status: int, message: str, param: str | None = None) -> ErrorReply:
        return ErrorReply(
            status,
            {"error": {"message": message, "type": self.error_type(status), "param": param, "code": status}},
        )

    def auth_error(self) -> ErrorReply:
        return ErrorReply(401, {"error": "Unauthorized"})

    def midstream_error(self, message: str) -> Json:
        return {"error": {"message": message, "type": self.error_type(500), "code": 500}}

    # --- models ---------------------------------------------------------------------------
    def model_entry(self, name: str, created: int, max_model_len: int) -> Json:
        return {"id": name, "object": "model", "created": created, "owned_by": self.owned_by}

    def models_list(self, entries: list[Json]) -> Json:
        return {"object": "list", "data": entries}

    # --- streaming --------------------------------------------------------------------------
    def first_delta(self, text: str) -> Json:
        return {"role": "assistant", "content": text}

    def role_chunk_separate(self) -> bool:
        """True: the role arrives in its own chunk before the first token (vLLM's shape)."""
        return False

    def delta(self, text: str) -> Json:
        return {"content": text}

    def final_delta(self) -> Json:
        return {}

    def usage_object(self) -> str:
        return "chat.completion.chunk"

    def frame(self, payload: bytes, index: int) -> bytes:
        """One SSE event; `index` counts events sent so far in this stream."""
        return b"data: " + payload + self.separator

    def comments_before_first_token(self, prompt_tokens: int) -> list[bytes]:
        return []

    def extra_final_fields(self, prompt_tokens: int, completion_tokens: int, ttft_s: float, gen_s: float) -> Json:
        return {}


class LlamaCpp(Style):
    name = "llamacpp"
    default_port = 8080
    owned_by = "llamacpp"
    loading = "503"
    metrics_need_flag = True
    metric_names = {
        "prompt_tokens": "llamacpp:prompt_tokens_total",
        "generation_tokens": "llamacpp:tokens_predicted_total",
        "prompt_seconds": "llamacpp:prompt_seconds_total",
        "generation_seconds": "llamacpp:tokens_predicted_seconds_total",
        "running": "llamacpp:requests_processing",
        "waiting": "llamacpp:requests_deferred",
        "requests": "llamacpp:n_decode_total",
        "busy_slots": "llamacpp:n_busy_slots_per_decode",
    }
    public_paths = frozenset({"/health", "/v1/health", "/models", "/v1/models"})
    done_after_midstream_error = False

    def error_type(self, status: int) -> str:
        return {
            400: "invalid_request_error",
            401: "authentication_error",
            403: "permission_error",
            404: "not_found_error",
            501: "not_supported_error",
            503: "unavailable_error",
        }.get(status, "server_error")

    def error(self, status: int, message: str, param: str | None = None) -> ErrorReply:
        return ErrorReply(status, {"error": {"code": status, "message": message, "type": self.error_type(status)}})

    def auth_error(self) -> ErrorReply:
        return self.error(401, "Invalid API Key")

    def midstream_error(self, message: str) -> Json:
        return {"error": {"code": 500, "message": message, "type": "server_error"}}

    def model_entry(self, name: str, created: int, max_model_len: int) -> Json:
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "llamacpp",
            "meta": {"vocab_type": 2, "n_vocab": 49152, "n_ctx_train": max_model_len, "n_embd": 576,
                     "n_params": 134515008, "size": 98000000},
        }

    def models_list(self, entries: list[Json]) -> Json:
        models = [{"name": e["id"], "model": e["id"], "type": "model", "capabilities": ["completion"]} for e in entries]
        return {"models": models, "object": "list", "data": entries}

    def first_delta(self, text: str) -> Json:
        return {"role": "assistant", "content": None}

    def role_chunk_separate(self) -> bool:
        return True

    def extra_final_fields(self, prompt_tokens: int, completion_tokens: int, ttft_s: float, gen_s: float) -> Json:
        return {"timings": {
            "prompt_n": prompt_tokens,
            "prompt_ms": ttft_s * 1000.0,
            "predicted_n": completion_tokens,
            "predicted_ms": gen_s * 1000.0,
            "predicted_per_second": completion_tokens / gen_s if gen_s > 0 else 0.0,
        }}


class Vllm(Style):
    name = "vllm"
    owned_by = "vllm"
    metric_names = {
        "prompt_tokens": "vllm:prompt_tokens_total",
        "generation_tokens": "vllm:generation_tokens_total",
        "requests": "vllm:request_success_total",
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "kv_usage": "vllm:kv_cache_usage_perc",
        "ttft": "vllm:time_to_first_token_seconds",
        "itl": "vllm:inter_token_latency_seconds",
        "e2e": "vllm:e2e_request_latency_seconds",
    }
    speculative_metric_names = {
        "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
        "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
    }
    metric_labels = ("engine", "model_name")
    public_paths = frozenset({"/health", "/metrics", "/version", "/ping"})

    def model_entry(self, name: str, created: int, max_model_len: int) -> Json:
        return {"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": name,
                "parent": None, "max_model_len": max_model_len, "permission": []}

    def first_delta(self, text: str) -> Json:
        return {"role": "assistant", "content": ""}

    def role_chunk_separate(self) -> bool:
        return True


class SGLang(Style):
    name = "sglang"
    default_port = 30000
    owned_by = "sglang"
    loading = "warmup"
    metric_names = {
        "prompt_tokens": "sglang:prompt_tokens_total",
        "generation_tokens": "sglang:generation_tokens_total",
        "requests": "sglang:num_requests_total",
        "running": "sglang:num_running_reqs",
        "waiting": "sglang:num_queue_reqs",
        "kv_usage": "sglang:token_usage",
        "ttft": "sglang:time_to_first_token_seconds",
        "itl": "sglang:inter_token_latency_seconds",
        "e2e": "sglang:e2e_request_latency_seconds",
    }
    metric_labels = ("model_name",)
    public_paths = frozenset({"/health", "/health_generate", "/ready", "/metrics"})

    def error(self, status: int, message: str, param: str | None = None) -> ErrorReply:
        return ErrorReply(status, {"object": "error", "message": message, "type": self.error_type(status),
                                   "param": param, "code": status})

    def model_entry(self, name: str, created: int, max_model_len: int) -> Json:
        return {"id": name, "object": "model", "created": created, "owned_by": "sglang", "root": name,
                "max_model_len": max_model_len}

    def first_delta(self, text: str) -> Json:
        return {"role": "assistant", "content": text}


class TrtLlm(Style):
    name = "trtllm"
    owned_by = "tensorrt_llm"
    metrics_path = "/prometheus/metrics"
    metric_names = {
        "prompt_tokens": "trtllm_prompt_tokens_total",
        "generation_tokens": "trtllm_generation_tokens_total",
        "requests": "trtllm_request_success_total",
        "running": "trtllm_num_requests_running",
        "waiting": "trtllm_num_requests_waiting",
        "kv_usage": "trtllm_kv_cache_utilization",
        "ttft": "trtllm_time_to_first_token_seconds",
        "itl": "trtllm_time_per_output_token_seconds",
        "e2e": "trtllm_e2e_request_latency_seconds",
    }
    public_paths = frozenset({"/health", "/metrics", "/prometheus/metrics", "/version"})
    embeddings = False

    def error(self, status: int, message: str, param: str | None = None) -> ErrorReply:
        return ErrorReply(status, {"message": message, "type": self.error_type(status), "code": status})

    def auth_error(self) -> ErrorReply:
        return self.error(401, "Unauthorized")

    def midstream_error(self, message: str) -> Json:
        return {"message": message, "type": self.error_type(500), "code": 500}

    def frame(self, payload: bytes, index: int) -> bytes:
        # trtllm-serve writes its first chunk with a space before the blank line.
        if index == 0:
            return b"data: " + payload + b" \n\n"
        return b"data: " + payload + b"\n\n"


class Tabby(Style):
    name = "tabby"
    default_port = 5000
    owned_by = "tabbyAPI"
    separator = b"\r\n\r\n"
    metrics_path = None
    public_paths = frozenset({"/health"})
    accepts_x_api_key = True

    def error(self, status: int, message: str, param: str | None = None) -> ErrorReply:
        return ErrorReply(status, {"detail": message})

    def context_error(self, message: str) -> ErrorReply:
        return ErrorReply(400, {"detail": {"message": message, "code": "context_length_exceeded"}})

    def auth_error(self) -> ErrorReply:
        return ErrorReply(401, {"detail": "Invalid API key"})

    def midstream_error(self, message: str) -> Json:
        return {"error": {"message": message, "trace": "Traceback (most recent call last): ..."}}

    def comments_before_first_token(self, prompt_tokens: int) -> list[bytes]:
        return [b": ping - 2026-01-01 00:00:00.000000+00:00\r\n\r\n"]


class Mlx(Style):
    name = "mlx"
    default_port = 8080
    owned_by = "system"
    loading = "health_ok"
    metrics_path = None
    public_paths = frozenset({"/health"})
    embeddings = False

    def error(self, status: int, message: str, param: str | None = None) -> ErrorReply:
        return ErrorReply(status, {"error": message})

    def midstream_error(self, message: str) -> Json:
        return {"error": message}

    def delta(self, text: str) -> Json:
        return {"role": "assistant", "content": text}

    def final_delta(self) -> Json:
        return {"role": "assistant", "content": ""}

    def usage_object(self) -> str:
        return "chat.completion"

    def comments_before_first_token(self, prompt_tokens: int) -> list[bytes]:
        half = prompt_tokens // 2
        return [f": keepalive {half}/{prompt_tokens}\n\n".encode(),
                f": keepalive {prompt_tokens}/{prompt_tokens}\n\n".encode()]


class Dynamo(Style):
    name = "dynamo"
    owned_by = "nvidia"
    loading = "models_empty"
    metric_names = {
        "prompt_tokens": "dynamo_frontend_input_sequence_tokens_total",
        "generation_tokens": "dynamo_frontend_output_tokens_total",
        "requests": "dynamo_frontend_requests_total",
        "running": "dynamo_frontend_inflight_requests",
        "waiting": "dynamo_frontend_queued_requests",
        "ttft": "dynamo_frontend_time_to_first_token_seconds",
        "itl": "dynamo_frontend_inter_token_latency_seconds",
        "e2e": "dynamo_frontend_request_duration_seconds",
        "model_ready": "dynamo_frontend_model_ready",
    }
    metric_labels = ("model",)
    public_paths = frozenset({"/health", "/live", "/metrics"})

    def error_type(self, status: int) -> str:
        return {400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 499: "Client Closed Request",
                503: "Service Unavailable", 529: "Overloaded"}.get(status, "Internal Server Error")

    def error(self, status: int, message: str, param: str | None = None) -> ErrorReply:
        return ErrorReply(status, {"message": message, "type": self.error_type(status), "code": status})

    def auth_error(self) -> ErrorReply:
        return self.error(401, "Unauthorized")

    def model_entry(self, name: str, created: int, max_model_len: int) -> Json:
        return {"id": name, "object": "object", "created": created, "owned_by": "nvidia",
                "context_window": max_model_len}


STYLES: dict[str, type[Style]] = {cls.name: cls for cls in (LlamaCpp, Vllm, SGLang, TrtLlm, Tabby, Mlx, Dynamo)}


def get_style(name: str) -> Style:
    try:
        return STYLES[name]()
    except KeyError:
        raise ValueError(f"unknown style {name!r}; choose one of {', '.join(sorted(STYLES))}") from None
