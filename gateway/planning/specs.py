"""Model specs: what the model's own files say (GGUF metadata, config.json, quant configs).

Nothing is downloaded. Parameter counts come from the GGUF tensor table, or are counted layer
by layer from config.json (gateway/planning/stack). Weight bytes are the checkpoint's own word
where it has one (gateway/planning/checkpoint.py: the index's total_size, the safetensors headers,
the GGUF's tensor table), else the arithmetic: parameters x bits per weight.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from gateway.planning.checkpoint import WeightsSource, disagreement, stated_bytes
from gateway.planning.gguf_meta import GgufFormatError, GgufMeta, read_gguf_meta
from gateway.planning.quant import Quant, read_quant
from gateway.planning.stack import count

Format = Literal[
    "gguf",
    "exl2",
    "exl3",
    "mlx",
    "awq",
    "gptq",
    "compressed-tensors",
    "bnb",
    "fp8",
    "nvfp4",
    "mxfp4",
    "bf16",
    "fp16",
    "fp32",
    "unknown",
]
"""`compressed-tensors`: integer weight quantisation in that layout (FP8 and NVFP4 ones read as fp8 / nvfp4);
`bnb`: bitsandbytes 4- or 8-bit."""
Family = Literal["dense", "moe", "multimodal", "hybrid"]
Attention = Literal["gqa", "mla"]

BITS_PER_WEIGHT: dict[str, float] = {"bf16": 16.0, "fp16": 16.0, "fp32": 32.0, "fp8": 8.0}


class ModelSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    format: Format
    name: str | None = None
    architecture: str | None = None
    family: Family = "dense"
    quantization: str | None = None
    """Quantisation as the file names it: a GGUF file type (Q4_1), "4.0 bpw", "4-bit g128"."""
    bits_per_weight: float | None = None
    """Bits per quantised weight, scales and zero points included."""
    unquantized_params: int = 0
    """Parameters a quantised checkpoint keeps at 16 bits: embeddings and lm_head (MXFP4: all but the experts)."""
    file_bytes: int | None = None
    """Weight bytes the checkpoint states (`weights_source`); null when only a config was read."""
    weights_source: WeightsSource = "arithmetic"
    """Where `weight_bytes` comes from: index (model.safetensors.index.json metadata.total_size),
    safetensors_headers, gguf (the GGUF files, whose tensor table gives the parameters), file_sizes
    (.bin files, unreadable headers), or arithmetic (parameters x bits per weight)."""
    arithmetic_bytes: int | None = None
    """The weights as config.json's layer arithmetic counts them: the fallback and the cross-check."""
    weights_check: str | None = None
    """The warning when the checkpoint's figure and the arithmetic differ by more than 3 %."""
    params_total: int | None = None
    params_active: int | None = None
    """Parameters read per token: all of them for dense, routed-in experts only for MoE."""
    vision_params: int = 0
    """The vision tower and projector (a multimodal config's vision_config, a llama.cpp mmproj file):
    in params_total, not in params_active."""
    layers: int | None = None
    hidden_size: int | None = None
    attention_heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    attention: Attention = "gqa"
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    context_length: int | None = None
    """Trained context length."""
    experts: int | None = None
    experts_used: int | None = None
    moe_layers: int = 0
    """Layers that hold the experts (the others have a dense MLP)."""
    sliding_window: int | None = None
    sliding_layers: int = 0
    """Layers whose KV cache holds only the last `sliding_window` tokens."""
    ssm_layers: int = 0
    """Layers with no per-token KV cache: SSM and linear attention (a fixed-size recurrent state), and
    Nemotron-H's MLP-only blocks."""
    mtp_layers: int = 0
    """Multi-token-prediction layers the checkpoint ships (config `num_nextn_predict_layers`): speculation's drafter."""
    notes: tuple[str, ...] = ()
    """What the files did not say and what was assumed instead."""

    @model_validator(mode="before")
    @classmethod
    def _source_of_older_specs(cls, data: Any) -> Any:
        """A spec JSON written before `weights_source` existed: file sizes when it has file_bytes."""
        if isinstance(data, dict) and "weights_source" not in data and data.get("file_bytes") is not None:
            return {**data, "weights_source": "file_sizes"}
        return data

    @property
    def weight_bytes(self) -> int | None:
        if self.file_bytes is not None:
            return self.file_bytes
        if self.params_total is not None and self.bits_per_weight is not None:
            kept = min(self.unquantized_params, self.params_total)
            return int((self.params_total - kept) * self.bits_per_weight / 8 + kept * 2)
        return None

    @property
    def active_weight_bytes(self) -> int | None:
        """Bytes of weights one token reads: the quantised share scaled by active / total parameters;
        the 16-bit parameters (embeddings, attention in MXFP4 checkpoints) are always read."""
        w = self.weight_bytes
        total, active = self.params_total, self.params_active
        if w is None or not total or not active:
            return w
        kept = min(self.unquantized_params, total)
        if kept and kept < total and active >= kept:
            return int(kept * 2 + (w - kept * 2) * (active - kept) / (total - kept))
        return int(w * active / total)


class SpecError(ValueError):
    """The model path does not hold a model we can read."""


# ---------------------------------------------------------------- GGUF


SHARD = re.compile(r"^(?P<stem>.+)-(?P<n>\d{5})-of-(?P<count>\d{5})\.gguf$")
"""llama.cpp's split naming (gguf-split): model-00001-of-00003.gguf; the first shard holds the metadata."""


def shard_paths(path: Path) -> list[Path]:
    """Every shard of a split GGUF (first shard first), or [path] for a single file."""
    m = SHARD.match(path.name)
    if m is None:
        return [path]
    count = int(m.group("count"))
    shards = [path.with_name(f"{m.group('stem')}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in shards if not p.is_file()]
    if missing:
        raise SpecError(f"{path}: split GGUF of {count} shards, missing {', '.join(missing)}")
    return shards


def _read_shards(shards: list[Path]) -> GgufMeta:
    metas = []
    for shard in shards:
        try:
            metas.append(read_gguf_meta(shard))
        except (GgufFormatError, ValueError, KeyError, OSError) as exc:
            raise SpecError(f"{shard}: not a readable GGUF file ({exc})") from exc
    return GgufMeta(fields=metas[0].fields, tensors=tuple(t for m in metas for t in m.tensors))


def load_gguf(path: Path) -> ModelSpec:
    import gguf

    shards = shard_paths(path)
    meta = _read_shards(shards)
    path = shards[0]
    arch = meta.fields.get("general.architecture")
    if arch is None:
        raise SpecError(f"{path}: GGUF without general.architecture")

    def get(key: str) -> Any:
        return meta.fields.get(f"{arch}.{key}")

    layers = get("block_count")
    hidden = get("embedding_length")
    heads = get("attention.head_count")
    kv_heads = get("attention.head_count_kv")
    ssm_layers = 0
    if isinstance(heads, list):  # per-layer head counts (hybrid models: 0 marks an SSM layer)
        heads = max(heads)
    if isinstance(kv_heads, list):
        ssm_layers = sum(1 for n in kv_heads if n == 0)
        kv_heads = max(kv_heads)
    kv_lora = get("attention.kv_lora_rank")
    head_dim = get("attention.key_length") or (hidden // heads if hidden and heads else None)
    experts = get("expert_count") or None
    experts_used = get("expert_used_count") or None
    file_type = meta.fields.get("general.file_type")
    try:
        quant = gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_") if file_type is not None else None
    except ValueError:
        quant = f"file_type {file_type}"
    total = sum(t.n_elements for t in meta.tensors)
    data_bytes = sum(t.n_bytes for t in meta.tensors)
    active = total
    if experts and experts_used:
        expert_params = sum(t.n_elements for t in meta.tensors if "_exps." in t.name)
        active = total - expert_params + expert_params * experts_used // experts
    blocks = _gguf_blocks(meta)
    ssm_layers = max(ssm_layers, blocks.recurrent)
    window, sliding = _gguf_sliding(str(arch), layers, get("attention.sliding_window"),
                                    get("attention.sliding_window_pattern"))
    projector = _projector(path)
    vision = 0
    file_bytes = sum(p.stat().st_size for p in shards)
    notes: list[str] = []
    if projector is not None:
        vision = sum(t.n_elements for t in _read_shards([projector]).tensors)
        file_bytes += projector.stat().st_size
        notes.append(f"the projector {projector.name} beside the model is counted ({vision / 1e9:.2f}B parameters, "
                     f"{projector.stat().st_size / 1e9:.2f} GB): llama-server loads it with --mmproj")
    return ModelSpec(
        path=str(path),
        format="gguf",
        name=meta.fields.get("general.name"),
        architecture=str(arch),
        family="multimodal" if projector else "hybrid" if ssm_layers else "moe" if experts else "dense",
        quantization=quant,
        bits_per_weight=round(data_bytes * 8 / total, 3) if total else None,
        file_bytes=file_bytes,
        weights_source="gguf",
        params_total=(total + vision) or None,
        params_active=active or None,
        vision_params=vision,
        layers=layers,
        hidden_size=hidden,
        attention_heads=heads,
        kv_heads=kv_heads or heads,
        head_dim=head_dim,
        context_length=get("context_length"),
        experts=experts,
        experts_used=experts_used,
        moe_layers=blocks.moe,
        attention="mla" if kv_lora else "gqa",
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=get("rope.dimension_count") if kv_lora else None,
        sliding_window=window if sliding else None,
        sliding_layers=sliding,
        ssm_layers=ssm_layers,
        notes=tuple(notes),
    )


BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")
ATTENTION_TENSORS = ("attn_k.", "attn_qkv.", "attn_kv_a_mqa.", "attn_k_b.")
"""A block holding one of these attends (GQA, fused QKV, MLA); the others are recurrent (SSM, linear)."""


@dataclass(frozen=True)
class _Blocks:
    recurrent: int
    moe: int


def _gguf_blocks(meta: GgufMeta) -> _Blocks:
    """The layer list as the tensor table gives it: which blocks attend, which hold experts (`*_exps`)."""
    names: dict[int, list[str]] = {}
    for t in meta.tensors:
        m = BLOCK.match(t.name)
        if m:
            names.setdefault(int(m.group(1)), []).append(m.group(2))
    attends = {i for i, ns in names.items() if any(n.startswith(ATTENTION_TENSORS) for n in ns)}
    recurrent = len(names) - len(attends) if attends else 0  # no known attention tensor at all: names unknown
    moe = sum(1 for ns in names.values() if any("_exps." in n for n in ns))
    return _Blocks(recurrent, moe)


def _gguf_sliding(arch: str, layers: int | None, window: int | None, pattern: Any) -> tuple[int | None, int]:
    """(window, sliding layers): the per-layer pattern where the file has one, else llama.cpp's per-architecture rule."""
    if not layers:
        return None, 0
    if arch == "llama4":  # llama.cpp: chunked attention of 8192 tokens in three layers of four, unless sliding_window 0
        return (None, 0) if window == 0 else (8192, layers - layers // 4)
    if not window:
        return None, 0
    if isinstance(pattern, list):
        return window, sum(1 for x in pattern[:layers] if x)
    if isinstance(pattern, int) and pattern > 1:
        return window, layers - layers // pattern
    if arch == "gemma2":
        return window, layers // 2  # alternating local and global layers
    if arch == "gemma3":
        return window, layers - layers // 6  # five local layers to each global one
    return window, 0


def _is_projector(path: Path) -> bool:
    return "mmproj" in path.name.lower()


def _projector(model: Path) -> Path | None:
    """The one llama.cpp multimodal projector (mmproj*.gguf) beside the model, if there is exactly one."""
    found = [p for p in model.parent.glob("*.gguf") if _is_projector(p) and p != model]
    return found[0] if len(found) == 1 else None


# ---------------------------------------------------------------- Hugging Face directories


DTYPES: dict[str, Format] = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _format_from_config(cfg: dict[str, Any]) -> tuple[Format, Quant | None, list[str]]:
    """(format, quantisation if any, notes on what was assumed)."""
    quant = read_quant(cfg)
    if quant is not None:
        return quant.format, quant, list(quant.notes)  # type: ignore[return-value]
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "").lower()
    if not dtype:
        return "bf16", None, ["config.json states no torch_dtype: assumed bf16 weights"]
    fmt: Format = DTYPES.get(dtype, "unknown")
    return fmt, None, [] if fmt != "unknown" else [f"torch_dtype {dtype!r} is not known to the planner"]


def _kv_heads(c: dict[str, Any], heads: int) -> tuple[int, str | None]:
    """KV heads under the names configs use; full multi-head attention (with a note) when none is given."""
    for key in ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"):
        if c.get(key):
            return int(c[key]), None
    if c.get("multi_query"):
        return 1, None
    return heads, (
        f"config.json gives no num_key_value_heads: assumed full multi-head attention "
        f"({heads} KV heads), the largest KV cache the model could have"
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise SpecError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a JSON object")
    return data


SIDE_FILES = ("quantization_config.json", "quant_config.json", "hf_quant_config.json")
"""EXL3, AWQ and ModelOpt write their quantisation beside config.json."""


def _arithmetic_bytes(params: int, kept: int, bits: float | None) -> int | None:
    if bits is None:
        return None
    kept = min(kept, params)
    return int((params - kept) * bits / 8 + kept * 2)


def load_hf_dir(path: Path) -> ModelSpec:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise SpecError(f"{path}: no config.json (expected a Hugging Face model directory)")
    cfg = _read_json(config_file)
    multimodal = "text_config" in cfg or "vision_config" in cfg
    text = {**cfg, **cfg.get("text_config", {})} if "text_config" in cfg else cfg
    fmt, quant, notes = _format_from_config(cfg)
    for extra in SIDE_FILES:
        if quant is None and (path / extra).is_file():
            fmt, quant, notes = _format_from_config({"quantization_config": _read_json(path / extra)})
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size") if k not in text]
    if missing:
        raise SpecError(f"{config_file}: missing {', '.join(missing)}")
    vision = cfg.get("vision_config") if isinstance(cfg.get("vision_config"), dict) else None
    try:
        params = count(text, vision)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise SpecError(f"{config_file}: the layer arithmetic cannot read this config ({type(exc).__name__}: {exc})") from exc
    stack = params.stack
    assert stack is not None
    heads = int(text["num_attention_heads"])
    kv_heads, kv_note = _kv_heads(text, heads)
    mla = bool(text.get("kv_lora_rank"))
    if kv_note and not mla:
        notes.append(kv_note)
    ssm = stack.recurrent
    family: Family = "multimodal" if multimodal else "hybrid" if ssm else "moe" if stack.experts else "dense"
    bpw = quant.bits if quant else BITS_PER_WEIGHT.get(fmt)
    kept = 0
    if quant is not None and quant.scope == "linear":
        kept = params.embeddings + params.vision  # the quantisers leave the vision tower at 16 bits too
    elif quant is not None and quant.scope == "experts":
        kept = params.total - params.experts
    stated, stated_notes = stated_bytes(path)
    notes += stated_notes
    arithmetic = _arithmetic_bytes(params.total, kept, bpw)
    check = None
    if stated is not None and arithmetic is not None:
        with_mtp = _arithmetic_bytes(params.total + params.mtp, kept, bpw)
        check = disagreement(stated.bytes, stated.source, arithmetic)
        if check and with_mtp and disagreement(stated.bytes, stated.source, with_mtp) is None:
            check = None  # the checkpoint ships the multi-token-prediction layer(s) too
    return ModelSpec(
        path=str(path),
        format=fmt,
        name=path.name,
        architecture=(text.get("architectures") or [text.get("model_type")])[0],
        family=family,
        quantization=quant.label if quant else None,
        bits_per_weight=bpw,
        unquantized_params=kept,
        file_bytes=stated.bytes if stated is not None else None,
        weights_source=stated.source if stated is not None else "arithmetic",
        arithmetic_bytes=arithmetic,
        weights_check=check,
        params_total=params.total,
        params_active=params.active,
        vision_params=params.vision,
        layers=int(text["num_hidden_layers"]),
        hidden_size=int(text["hidden_size"]),
        attention_heads=heads,
        kv_heads=kv_heads,
        head_dim=int(text.get("head_dim") or int(text["hidden_size"]) // heads),
        attention="mla" if mla else "gqa",
        kv_lora_rank=text.get("kv_lora_rank"),
        qk_rope_head_dim=text.get("qk_rope_head_dim") if mla else None,
        context_length=text.get("max_position_embeddings"),
        experts=stack.experts or None,
        experts_used=stack.experts_used or None,
        moe_layers=stack.moe,
        sliding_window=stack.window if stack.sliding else None,
        sliding_layers=stack.sliding,
        ssm_layers=ssm,
        mtp_layers=int(text.get("num_nextn_predict_layers") or text.get("mtp_num_hidden_layers") or 0),
        notes=tuple(notes),
    )


def load_spec(path: Path) -> ModelSpec:
    path = Path(path)
    if path.is_dir():
        ggufs = [p for p in sorted(path.glob("*.gguf")) if not _is_projector(p)]
        models = {p for p in ggufs if SHARD.match(p.name) is None} | {
            p for p in ggufs if (m := SHARD.match(p.name)) and int(m.group("n")) == 1
        }
        if not (path / "config.json").is_file() and len(models) == 1:
            return load_gguf(models.pop())
        return load_hf_dir(path)
    if not path.exists():
        raise SpecError(f"{path}: no such file or directory")
    if path.name == "config.json":
        return load_hf_dir(path.parent)
    if path.suffix == ".json":  # a ModelSpec written out before (e.g. for a model not on this machine)
        try:
            return ModelSpec.model_validate_json(path.read_text())
        except ValueError as exc:
            raise SpecError(f"{path}: neither config.json nor a ModelSpec JSON ({exc})") from exc
    if path.suffix == ".gguf":
        return load_gguf(path)
    raise SpecError(f"{path}: expected a .gguf file, a model directory with config.json, or a ModelSpec JSON")
