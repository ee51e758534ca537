"""OpenAI request models: permissive (unknown fields pass through), strict on what the gateway uses."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class _Permissive(BaseModel):
    model_config = ConfigDict(extra="allow")


_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"type": "string", "minLength": 1}, "text": {"type": "string"}}}
_CONTENT_SCHEMA = {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": _TEXT_PART}, {"type": "null"}],
                   "description": "Required, except on an assistant message that carries tool_calls"}


class ChatMessage(_Permissive):
    model_config = ConfigDict(extra="allow", json_schema_extra={"required": ["role", "content"]})

    role: Role
    tool_calls: list[dict[str, Any]] | None = None
    function_call: dict[str, Any] | None = None
    content: Annotated[str | list[dict[str, Any]] | None, WithJsonSchema(_CONTENT_SCHEMA)] = Field(
        default=None, validate_default=True
    )
    """Required, except on an assistant message that carries tool calls."""

    @field_validator("content")
    @classmethod
    def _content(cls, v: str | list[dict[str, Any]] | None, info: ValidationInfo) -> str | list[dict[str, Any]] | None:
        if v is None:
            if info.data.get("role") == "assistant" and (info.data.get("tool_calls") or info.data.get("function_call")):
                return v
            raise ValueError("content is required: a string or a list of content parts")
        if isinstance(v, list):
            if not v:
                raise ValueError("content must not be an empty list")
            for i, part in enumerate(v):
                kind = part.get("type")
                if not isinstance(kind, str) or not kind:
                    raise ValueError(f"content part {i} needs a type (e.g. \"text\")")
                if kind == "text" and not isinstance(part.get("text"), str):
                    raise ValueError(f"content part {i} is of type text but has no text")
        return v


class StreamOptions(_Permissive):
    include_usage: bool = False


class ResponseFormat(_Permissive):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class _Sampling(_Permissive):
    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    n: int | None = Field(default=None, ge=1, le=128)
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: Annotated[dict[str, float], WithJsonSchema({
        "type": "object", "propertyNames": {"pattern": "^[0-9]{1,9}$"},
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
        "description": "token id -> bias"})] | None = None
    # llama.cpp's sampling extras (vLLM and llama-server take them too): typed here, so a wrong type is
    # the client's 400 rather than an engine's failure
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repeat_penalty: float | None = Field(default=None, gt=0)
    typical_p: float | None = Field(default=None, gt=0, le=1)
    mirostat_mode: int | None = Field(default=None, ge=0, le=2)
    mirostat_tau: float | None = Field(default=None, ge=0)
    mirostat_eta: float | None = Field(default=None, ge=0)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)


_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
TokenInput = Annotated[
    str | list[str] | list[StrictInt] | list[list[StrictInt]],
    WithJsonSchema({"anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
        _IDS,
        {"type": "array", "minItems": 1, "items": _IDS},
    ]}),
]
"""Text, texts, token ids, or lists of token ids (never floats or booleans passed off as ids)."""


def check_inputs(v: Any, handler: ValidatorFunctionWrapHandler, name: str) -> Any:
    """One of the TokenInput forms; no empty text, no empty list, no negative token id (the upper
    bound is the model's: api/validate.py)."""
    try:
        v = handler(v)
    except ValidationError:
        raise ValueError(f"{name} must be a string, a list of strings, a list of token ids (integers) "
                         "or a list of token-id lists") from None
    items = v if isinstance(v, list) and v and not isinstance(v[0], int) else [v]
    for i, item in enumerate(items):
        where = name if len(items) == 1 and item is v else f"{name}[{i}]"
        if isinstance(item, str | list) and not item:
            raise ValueError(f"{where} must not be empty")
        if isinstance(item, list) and any(t < 0 for t in item):
            raise ValueError(f"{where}: token ids must be >= 0")
    return v


class CompletionRequest(_Sampling):
    prompt: TokenInput
    echo: bool = False
    max_tokens: int | None = Field(default=None, ge=0)
    """0 only with `echo`: score the prompt, generate nothing (legacy OpenAI scoring, as lm-eval sends it)."""
    logprobs: int | None = Field(default=None, ge=0, le=20)
    """The legacy field: how many alternatives per token (0: the chosen token's logprob alone)."""

    @model_validator(mode="after")
    def _score_only(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise PydanticCustomError("score_only", "max_tokens 0 generates nothing: it needs echo: true (score the prompt only)")
        return self

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _valid(cls, v: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return check_inputs(v, handler, "prompt")


class EmbeddingRequest(_Permissive):
    model: str = Field(min_length=1)
    input: TokenInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)

    @field_validator("input", mode="wrap")
    @classmethod
    def _valid(cls, v: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return check_inputs(v, handler, "input")


def engine_body(parsed: BaseModel) -> dict[str, Any]:
    """What the engine receives: the validated request (coerced values, unknown fields kept),
    never the raw body."""
    return parsed.model_dump(exclude_unset=True, by_alias=True)
