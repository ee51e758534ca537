"""Quantisation layouts of Hugging Face checkpoints: format, label, bits per weight, and what stays 16-bit.

Bits per weight count the stored scales and zero points, per the layout:
  GPTQ / AWQ:          bits + (16-bit scale + packed `bits`-bit zero point) per group
  compressed-tensors:  bits + 16-bit scale per group (+ zero point when asymmetric); per-channel ~ bits
  bitsandbytes:        NF4/FP4 4 bits + fp32 absmax per 64 (double quant: 8-bit absmax + fp32 per 256 blocks)
  NVFP4:               4 bits + FP8 scale per 16 = 4.5;  MXFP4: 4 bits + 8-bit scale per 32 = 4.25
  FP8 (fp8, fbgemm_fp8, modelopt, compressed-tensors float 8): 8 bits (block or channel scales ~0)
Embeddings and lm_head stay 16-bit in all of these (`scope="linear"`); MXFP4 checkpoints (gpt-oss)
quantise only the MoE experts (`scope="experts"`); EXL2/EXL3 and MLX quantise everything (`scope="all"`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Scope = Literal["all", "linear", "experts"]


@dataclass(frozen=True)
class Quant:
    format: str
    label: str | None
    bits: float | None
    scope: Scope = "linear"
    notes: tuple[str, ...] = field(default=())


def _group_bits(bits: int, group: Any, zero_point: bool) -> tuple[float, str]:
    g = int(group) if group not in (None, "") else 128
    if g <= 0:  # -1: one scale per output channel, negligible per weight
        return float(bits), "per-channel"
    return bits + (16 + (bits if zero_point else 0)) / g, f"g{g}"


def _gptq_awq(method: str, q: dict[str, Any]) -> Quant:
    bits = int(q.get("bits", q.get("w_bit", 4)))
    group = q.get("group_size", q.get("q_group_size", 128))
    bpw, g = _group_bits(bits, group, zero_point=True)  # both store packed zero points even when symmetric
    variant = q.get("version") or q.get("checkpoint_format") or ""
    label = f"{bits}-bit {g}" + (f" {str(variant).lower()}" if variant else "")
    return Quant(method, label, round(bpw, 4))


def _compressed_tensors(q: dict[str, Any]) -> Quant:
    groups = q.get("config_groups") or {}
    weights = [g.get("weights") or {} for g in groups.values() if isinstance(g, dict)]
    if not weights:
        return Quant("unknown", "compressed-tensors", None, notes=("compressed-tensors config without config_groups",))
    w = max(weights, key=lambda x: int(x.get("num_bits") or 0))  # mixed schemes: size by the widest
    bits = int(w.get("num_bits") or 8)
    kind = str(w.get("type") or "int")
    acts = next((g.get("input_activations") for g in groups.values() if isinstance(g, dict)), None) or {}
    act = f"A{acts.get('num_bits')}" if acts.get("num_bits") else "A16"
    if kind == "float" and bits == 8:
        return Quant("fp8", f"compressed-tensors W8{act}-FP8", 8.0)
    if kind == "float" and bits == 4:
        return Quant("nvfp4", "compressed-tensors NVFP4", 4.5)
    strategy = str(w.get("strategy") or "group")
    group = w.get("group_size") if strategy == "group" else -1
    bpw, g = _group_bits(bits, group, zero_point=not w.get("symmetric", True))
    return Quant("compressed-tensors", f"compressed-tensors W{bits}{act} int {g}", round(bpw, 4))


def _bitsandbytes(q: dict[str, Any]) -> Quant:
    if q.get("load_in_8bit"):
        return Quant("bnb", "bnb int8", 8.0)
    kind = str(q.get("bnb_4bit_quant_type") or "fp4")
    if q.get("bnb_4bit_use_double_quant"):
        return Quant("bnb", f"bnb {kind} double-quant", round(4 + 8 / 64 + 32 / (64 * 256), 4))
    return Quant("bnb", f"bnb {kind}", 4 + 32 / 64)


def _modelopt(q: dict[str, Any]) -> Quant:
    algo = str(q.get("quant_algo") or (q.get("quantization") or {}).get("quant_algo") or "").upper()
    if algo == "FP8" or algo.startswith("FP8"):
        return Quant("fp8", "modelopt FP8", 8.0)
    if algo == "NVFP4":
        return Quant("nvfp4", "modelopt NVFP4", 4.5)
    return Quant("unknown", f"modelopt {algo or '?'}", None, notes=(f"ModelOpt quant_algo {algo or 'missing'} is not known",))


def read_quant(cfg: dict[str, Any]) -> Quant | None:
    """The checkpoint's quantisation from config.json (or a side file's dict under `quantization_config`)."""
    q = cfg.get("quantization_config") or {}
    if "quantization" in q and "quant_method" not in q:  # hf_quant_config.json (ModelOpt) read as a side file
        return _modelopt(q)
    method = str(q.get("quant_method", "")).lower().replace("_", "-")
    if method in ("exl2", "exl3"):
        bits = float(q.get("bits", 0)) or None
        return Quant(method, f"{bits} bpw" if bits else None, bits, scope="all")
    if method in ("awq", "gptq"):
        return _gptq_awq(method, q)
    if method in ("auto-round", "intel/auto-round"):
        packing = str(q.get("packing_format", "auto_gptq"))
        return _gptq_awq("awq" if "awq" in packing else "gptq", q)
    if method == "compressed-tensors":
        return _compressed_tensors(q)
    if method == "bitsandbytes" or q.get("load_in_4bit") or q.get("load_in_8bit"):
        return _bitsandbytes(q)
    if method == "modelopt":
        return _modelopt(q)
    if method == "mxfp4":
        return Quant("mxfp4", "MXFP4", 4.25, scope="experts")
    if method in ("fp8", "fbgemm-fp8") or "float8" in str(q.get("fmt", "")):
        return Quant("fp8", "fp8" if method == "fp8" else "fbgemm FP8", 8.0)
    if method:
        return Quant("unknown", method, None, notes=(f"quantisation method {method!r} is not known to the planner",))
    mlx_q = cfg.get("quantization")
    if isinstance(mlx_q, dict) and "bits" in mlx_q:
        bits = int(mlx_q["bits"])
        group = int(mlx_q.get("group_size", 64))
        return Quant("mlx", f"{bits}-bit g{group}", bits + 32 / group, scope="all")  # fp16 scale and bias
    return None
