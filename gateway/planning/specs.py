"""Model specs: what the model's own files say (GGUF metadata, config.json, quant configs).

Nothing is downloaded. Parameter counts come from the GGUF tensor table, or are computed
from config.json with the formulas in `_hf_params` when the weights are not on disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from gateway.planning.gguf_meta import GgufFormatError, read_gguf_meta

Format = Literal["gguf", "exl2", "exl3", "mlx", "awq", "gptq", "fp8", "bf16", "fp16", "fp32", "unknown"]
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

    @property
    def weight_bytes(self) -> int | None:
        if self.file_bytes is not None:
            return self.file_bytes
        if self.params_total is not None and self.bits_per_weight is not None:
            return int(self.params_total * self.bits_per_weight / 8)
        return None

    @property
    def active_weight_bytes(self) -> int | None:
        w = self.weight_bytes
        if w is None or not self.params_total or not self.params_active:
            return w
        return int(w * self.params_active / self.params_total)


class SpecError(ValueError):
    """The model path does not hold a model we can read."""


# ---------------------------------------------------------------- GGUF


def load_gguf(path: Path) -> ModelSpec:
    import gguf

    try:
        meta = read_gguf_meta(path)
    except (GgufFormatError, ValueError, KeyError, OSError) as exc:
        raise SpecError(f"{path}: not a readable GGUF file ({exc})") from exc
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
        file_bytes=path.stat().st_size,
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


def _format_from_config(cfg: dict[str, Any]) -> tuple[Format, str | None, float | None]:
    q = cfg.get("quantization_config") or {}
    method = str(q.get("quant_method", "")).lower()
    if method in ("exl2", "exl3"):
        bits = float(q.get("bits", 0)) or None
        return method, f"{bits} bpw" if bits else None, bits  # type: ignore[return-value]
    if method in ("awq", "gptq"):
        bits = int(q.get("bits", q.get("w_bit", 4)))
        group = int(q.get("group_size", q.get("q_group_size", 128)) or 128)
        # a 16-bit scale (and zero point) per group adds 32/group bits per weight
        return method, f"{bits}-bit g{group}", bits + 32 / group  # type: ignore[return-value]
    if method == "fp8" or "float8" in str(q.get("fmt", "")):
        return "fp8", "fp8", 8.0
    mlx_q = cfg.get("quantization")
    if isinstance(mlx_q, dict) and "bits" in mlx_q:
        bits = int(mlx_q["bits"])
        group = int(mlx_q.get("group_size", 64))
        return "mlx", f"{bits}-bit g{group}", bits + 32 / group
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "").lower()
    fmt: Format = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, "unknown")  # type: ignore[assignment]
    return fmt, None, BITS_PER_WEIGHT.get(fmt)


def _hf_params(c: dict[str, Any]) -> tuple[int, int]:
    """(total, active) parameters of a decoder-only transformer from its config.json.

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
    kv = int(c.get("num_key_value_heads") or heads)
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
        return total + layers * dense_mlp, active + layers * dense_mlp
    used = int(c.get("num_experts_per_tok") or c.get("num_experts_per_token") or 1)
    expert = 3 * h * int(c.get("moe_intermediate_size") or c.get("intermediate_size") or 0)
    shared = int(c.get("n_shared_experts") or 0)
    dense_layers = int(c.get("first_k_dense_replace") or 0) + len(c.get("mlp_only_layers") or [])
    moe_layers = layers - dense_layers
    router = h * n_exp
    total += dense_layers * dense_mlp + moe_layers * ((n_exp + shared) * expert + router)
    active += dense_layers * dense_mlp + moe_layers * ((used + shared) * expert + router)
    return total, active


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


def load_hf_dir(path: Path) -> ModelSpec:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise SpecError(f"{path}: no config.json (expected a Hugging Face model directory)")
    cfg: dict[str, Any] = json.loads(config_file.read_text())
    multimodal = "text_config" in cfg or "vision_config" in cfg
    text = {**cfg, **cfg.get("text_config", {})} if "text_config" in cfg else cfg
    fmt, quant, bpw = _format_from_config(cfg)
    for extra in ("quantization_config.json", "quant_config.json"):  # EXL3 / AWQ side files
        if fmt in ("bf16", "fp16", "unknown") and (path / extra).is_file():
            fmt, quant, bpw = _format_from_config({"quantization_config": json.loads((path / extra).read_text())})
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size") if k not in text]
    if missing:
        raise SpecError(f"{config_file}: missing {', '.join(missing)}")
    total, active = _hf_params(text)
    weights = [p for p in path.iterdir() if p.suffix in (".safetensors", ".bin")]
    sliding, ssm = _layer_kinds(text)
    experts = _experts(text)
    heads = int(text["num_attention_heads"])
    mla = bool(text.get("kv_lora_rank"))
    family: Family = "multimodal" if multimodal else "hybrid" if ssm else "moe" if experts else "dense"
    return ModelSpec(
        path=str(path),
        format=fmt,
        name=path.name,
        architecture=(text.get("architectures") or [text.get("model_type")])[0],
        family=family,
        quantization=quant,
        bits_per_weight=bpw,
        file_bytes=sum(p.stat().st_size for p in weights) or None,
        params_total=total,
        params_active=active,
        layers=int(text["num_hidden_layers"]),
        hidden_size=int(text["hidden_size"]),
        attention_heads=heads,
        kv_heads=int(text.get("num_key_value_heads") or heads),
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
    )


def load_spec(path: Path) -> ModelSpec:
    path = Path(path)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").is_file() and len(ggufs) == 1:
            return load_gguf(ggufs[0])
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
