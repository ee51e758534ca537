"""Model specs: what the model's own files say (GGUF metadata, config.json, quant configs).

Nothing is downloaded. Parameter counts come from the GGUF tensor table, or are computed
from config.json with the formulas in `_hf_params` when the weights are not on disk.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from gateway.planning.gguf_meta import GgufFormatError, GgufMeta, read_gguf_meta
from gateway.planning.quant import Quant, read_quant

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
    """Bytes of weight files on disk; null when only a config was read."""
    params_total: int | None = None
    params_active: int | None = None
    """Parameters read per token: all of them for dense, routed-in experts only for MoE."""
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
    sliding_window: int | None = None
    sliding_layers: int = 0
    """Layers whose KV cache holds only the last `sliding_window` tokens."""
    ssm_layers: int = 0
    """Layers with a fixed-size recurrent state and no per-token KV cache."""
    mtp_layers: int = 0
    """Multi-token-prediction layers the checkpoint ships (config `num_nextn_predict_layers`): speculation's drafter."""
    notes: tuple[str, ...] = ()
    """What the files did not say and what was assumed instead."""

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
    window = get("attention.sliding_window")
    return ModelSpec(
        path=str(path),
        format="gguf",
        name=meta.fields.get("general.name"),
        architecture=str(arch),
        family="hybrid" if ssm_layers else "moe" if experts else "dense",
        quantization=quant,
        bits_per_weight=round(data_bytes * 8 / total, 3) if total else None,
        file_bytes=sum(p.stat().st_size for p in shards),
        params_total=total or None,
        params_active=active or None,
        layers=layers,
        hidden_size=hidden,
        attention_heads=heads,
        kv_heads=kv_heads or heads,
        head_dim=head_dim,
        context_length=get("context_length"),
        experts=experts,
        experts_used=experts_used,
        attention="mla" if kv_lora else "gqa",
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=get("rope.dimension_count") if kv_lora else None,
        sliding_window=window,
        sliding_layers=_gguf_sliding_layers(str(arch), layers, window),
        ssm_layers=ssm_layers,
    )


def _gguf_sliding_layers(arch: str, layers: int | None, window: int | None) -> int:
    if not window or not layers:
        return 0
    if arch == "gemma2":
        return layers // 2  # alternating local and global layers
    if arch == "gemma3":
        return layers - layers // 6  # five local layers to each global one
    return 0


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


@dataclass(frozen=True)
class Params:
    total: int
    active: int
    embeddings: int
    """Input embeddings and lm_head (once when tied)."""
    experts: int
    """Routed-expert parameters (all experts, all MoE layers)."""


def _hf_params(c: dict[str, Any]) -> Params:
    """Parameters of a decoder-only transformer from its config.json.

    embeddings: vocab x hidden, doubled unless tie_word_embeddings
    attention (GQA): hidden x heads x head_dim (q) + 2 x hidden x kv_heads x head_dim (k, v)
                     + heads x head_dim x hidden (o)
    attention (MLA): hidden x q_lora + q_lora x heads x (nope + rope)     (q, or hidden x heads x (nope + rope))
                     + hidden x (kv_lora + rope) + kv_lora x heads x (nope + v) + heads x v x hidden
    gated MLP: 3 x hidden x intermediate; an MoE layer holds `experts` of them (+ shared), reads `used`
    Norms and biases are left out (well under 0.1% of any model here).
    """
    h = int(c["hidden_size"])
    layers = int(c["num_hidden_layers"])
    heads = int(c["num_attention_heads"])
    kv, _ = _kv_heads(c, heads)
    hd = int(c.get("head_dim") or h // heads)
    vocab = int(c["vocab_size"])
    # transformers' default is model-specific: Gemma ties input and output embeddings
    tied = c.get("tie_word_embeddings", str(c.get("model_type", "")).startswith("gemma"))
    embed = vocab * h * (1 if tied else 2)
    if c.get("kv_lora_rank"):
        nope, rope, v = int(c["qk_nope_head_dim"]), int(c["qk_rope_head_dim"]), int(c["v_head_dim"])
        qr = c.get("q_lora_rank")
        q = h * int(qr) + int(qr) * heads * (nope + rope) if qr else h * heads * (nope + rope)
        lora = int(c["kv_lora_rank"])
        attn = q + h * (lora + rope) + lora * heads * (nope + v) + heads * v * h
    else:
        attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    dense_mlp = 3 * h * int(c.get("intermediate_size") or 0)
    n_exp = _experts(c)
    total = active = embed + layers * attn
    if not n_exp:
        return Params(total + layers * dense_mlp, active + layers * dense_mlp, embed, 0)
    used = int(c.get("num_experts_per_tok") or c.get("num_experts_per_token") or 1)
    expert = 3 * h * int(c.get("moe_intermediate_size") or c.get("intermediate_size") or 0)
    shared = int(c.get("n_shared_experts") or 0)
    dense_layers = int(c.get("first_k_dense_replace") or 0) + len(c.get("mlp_only_layers") or [])
    moe_layers = layers - dense_layers
    router = h * n_exp
    total += dense_layers * dense_mlp + moe_layers * ((n_exp + shared) * expert + router)
    active += dense_layers * dense_mlp + moe_layers * ((used + shared) * expert + router)
    return Params(total, active, embed, moe_layers * n_exp * expert)


def _experts(c: dict[str, Any]) -> int | None:
    for key in ("n_routed_experts", "num_local_experts", "num_experts"):
        if c.get(key):
            return int(c[key])
    return None


def _layer_kinds(c: dict[str, Any]) -> tuple[int, int]:
    """(sliding-window layers, SSM/linear-attention layers) from the config."""
    layers = int(c["num_hidden_layers"])
    types = c.get("layer_types")
    if isinstance(types, list):
        sliding = sum(1 for t in types if "sliding" in str(t))
        ssm = sum(1 for t in types if str(t) in ("linear_attention", "mamba", "ssm", "recurrent"))
        return sliding, ssm
    if c.get("attn_layer_period"):  # Jamba: one attention layer per period, the rest Mamba
        return 0, layers - layers // int(c["attn_layer_period"])
    if c.get("sliding_window") and str(c.get("model_type", "")).startswith("gemma2"):
        return layers // 2, 0  # Gemma 2 alternates local (sliding) and global layers
    if c.get("sliding_window") and "max_window_layers" in c:  # Qwen2: SWA from max_window_layers on
        return (max(0, layers - int(c["max_window_layers"])) if c.get("use_sliding_window") else 0), 0
    if c.get("sliding_window") and str(c.get("model_type", "")) in ("mistral", "mixtral"):
        return layers, 0
    return 0, 0


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise SpecError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a JSON object")
    return data


def _weight_files(path: Path) -> list[Path]:
    """The files an engine loads: those the safetensors index names, else all .safetensors, else .bin.

    Repositories often ship the same weights twice (consolidated.safetensors beside the sharded
    model-0000N files, or .bin beside .safetensors); counting both would double the size.
    """
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = set((_read_json(index).get("weight_map") or {}).values())
        listed = [path / n for n in sorted(names) if (path / n).is_file()]
        if listed:
            return listed
    safetensors = sorted(path.glob("*.safetensors"))
    return safetensors or sorted(path.glob("*.bin"))


SIDE_FILES = ("quantization_config.json", "quant_config.json", "hf_quant_config.json")
"""EXL3, AWQ and ModelOpt write their quantisation beside config.json."""


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
    params = _hf_params(text)
    weights = _weight_files(path)
    sliding, ssm = _layer_kinds(text)
    experts = _experts(text)
    heads = int(text["num_attention_heads"])
    kv_heads, kv_note = _kv_heads(text, heads)
    mla = bool(text.get("kv_lora_rank"))
    if kv_note and not mla:
        notes.append(kv_note)
    family: Family = "multimodal" if multimodal else "hybrid" if ssm else "moe" if experts else "dense"
    bpw = quant.bits if quant else BITS_PER_WEIGHT.get(fmt)
    kept = 0
    if quant is not None and quant.scope == "linear":
        kept = params.embeddings
    elif quant is not None and quant.scope == "experts":
        kept = params.total - params.experts
    return ModelSpec(
        path=str(path),
        format=fmt,
        name=path.name,
        architecture=(text.get("architectures") or [text.get("model_type")])[0],
        family=family,
        quantization=quant.label if quant else None,
        bits_per_weight=bpw,
        unquantized_params=kept,
        file_bytes=sum(p.stat().st_size for p in weights) or None,
        params_total=params.total,
        params_active=params.active,
        layers=int(text["num_hidden_layers"]),
        hidden_size=int(text["hidden_size"]),
        attention_heads=heads,
        kv_heads=kv_heads,
        head_dim=int(text.get("head_dim") or int(text["hidden_size"]) // heads),
        attention="mla" if mla else "gqa",
        kv_lora_rank=text.get("kv_lora_rank"),
        qk_rope_head_dim=text.get("qk_rope_head_dim") if mla else None,
        context_length=text.get("max_position_embeddings"),
        experts=experts,
        experts_used=text.get("num_experts_per_tok") if experts else None,
        sliding_window=text.get("sliding_window") if sliding else None,
        sliding_layers=sliding,
        ssm_layers=ssm,
        mtp_layers=int(text.get("num_nextn_predict_layers") or text.get("mtp_num_hidden_layers") or 0),
        notes=tuple(notes),
    )


def load_spec(path: Path) -> ModelSpec:
    path = Path(path)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
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
