"""Which layer is which: the mixer (attention, sliding, linear attention, SSM) and the MLP (dense or MoE).

Conventions read, each as its model's code in transformers / vLLM applies it (layer index i from 0):
  mixer:  `layer_types` (Gemma 3, gpt-oss, Qwen3-Next, Granite 4 hybrids); Llama 4 `no_rope_layers`
          (RoPE layers attend in chunks of `attention_chunk_size`, every `no_rope_layer_interval`-th is
          global); Qwen3-Next `full_attention_interval`; Jamba `attn_layer_period` / `attn_layer_offset`
          (the rest Mamba); Gemma 2 (even layers slide), Gemma 3 `sliding_window_pattern`, Qwen2
          `max_window_layers`, Mistral / Mixtral (all slide); Nemotron-H `hybrid_override_pattern`
          (one block per character: M Mamba-2, * attention, - MLP, E experts).
  MLP:    an explicit `moe_layers` list; Llama 4 `interleave_moe_layer_step`; Jamba
          `expert_layer_period` / `expert_layer_offset`; DeepSeek `first_k_dense_replace` +
          `moe_layer_freq`; ERNIE 4.5 `moe_layer_start_index` / `_end_index` / `_interval`; Qwen MoE
          `decoder_sparse_step` and `mlp_only_layers`; otherwise every layer of an MoE config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Mixer = Literal["attention", "sliding", "linear_attention", "mamba", "cross_attention", "none"]
Mlp = Literal["dense", "moe", "none"]
"""`none`: Nemotron-H's blocks are each one of a Mamba-2 mixer, attention, an MLP or experts.
`cross_attention`: Llama 3.2 Vision's layers that attend to the image: their KV is the image's, not per token."""

LINEAR = frozenset({"linear_attention", "gated_deltanet", "lightning_attention"})
SSM = frozenset({"mamba", "mamba2", "ssm", "recurrent", "conv"})


@dataclass(frozen=True)
class Layer:
    mixer: Mixer
    mlp: Mlp
    mlp_size: int
    """The dense MLP's intermediate size, or each routed expert's."""
    shared_size: int = 0
    """Intermediate size of the shared expert(s) beside the routed ones (summed), MoE layers only."""


@dataclass(frozen=True)
class Stack:
    layers: tuple[Layer, ...]
    experts: int = 0
    experts_used: int = 0
    window: int | None = None
    """Tokens a sliding (or chunked) layer keeps in its KV cache."""

    @property
    def sliding(self) -> int:
        return sum(1 for layer in self.layers if layer.mixer == "sliding")

    @property
    def recurrent(self) -> int:
        """Layers with no per-token KV: linear attention and SSM (a fixed-size state), MLP-only blocks,
        cross-attention to the image."""
        return sum(1 for layer in self.layers if layer.mixer in ("linear_attention", "mamba", "none", "cross_attention"))

    @property
    def moe(self) -> int:
        return sum(1 for layer in self.layers if layer.mlp == "moe")


def _int(c: dict[str, Any], *keys: str) -> int:
    for key in keys:
        value = c.get(key)
        if value not in (None, "", False):
            return int(value)
    return 0


def experts(c: dict[str, Any]) -> int:
    return _int(c, "n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")


def _mixer_of(name: str) -> Mixer:
    t = name.lower()
    if t in LINEAR:
        return "linear_attention"
    if t in SSM:
        return "mamba"
    if "sliding" in t or "chunked" in t or "local" in t:
        return "sliding"
    return "attention"


def _mixers(c: dict[str, Any], n: int) -> tuple[list[Mixer], int | None]:
    """Each layer's mixer, and the sliding window (None when no layer slides)."""
    model = str(c.get("model_type", ""))
    window = c.get("sliding_window") or None
    types = c.get("layer_types")
    if isinstance(types, list) and len(types) >= n:
        mixers = [_mixer_of(str(t)) for t in types[:n]]
        if "sliding" in mixers and window is None and c.get("attention_chunk_size"):
            window = c["attention_chunk_size"]
        return mixers, window if "sliding" in mixers else None
    if model.startswith("llama4") and c.get("attention_chunk_size"):
        rope = c.get("no_rope_layers")
        if not isinstance(rope, list) or len(rope) < n:
            interval = _int(c, "no_rope_layer_interval") or 4
            rope = [int((i + 1) % interval != 0) for i in range(n)]
        return ["sliding" if rope[i] else "attention" for i in range(n)], int(c["attention_chunk_size"])
    cross = c.get("cross_attention_layers")
    if isinstance(cross, list) and cross:  # Llama 3.2 Vision (mllama)
        return ["cross_attention" if i in cross else "attention" for i in range(n)], None
    if c.get("full_attention_interval"):
        k = int(c["full_attention_interval"])
        return ["attention" if (i + 1) % k == 0 else "linear_attention" for i in range(n)], None
    if c.get("attn_layer_period"):
        period, offset = int(c["attn_layer_period"]), _int(c, "attn_layer_offset")
        return ["attention" if i % period == offset else "mamba" for i in range(n)], None
    if window and model.startswith("gemma2"):
        return ["sliding" if i % 2 == 0 else "attention" for i in range(n)], window
    if window and model.startswith("gemma3") and c.get("sliding_window_pattern"):
        k = int(c["sliding_window_pattern"])
        return ["attention" if (i + 1) % k == 0 else "sliding" for i in range(n)], window
    if window and "max_window_layers" in c:  # Qwen2: sliding from max_window_layers on, when switched on
        if not c.get("use_sliding_window"):
            return ["attention"] * n, None
        first = int(c["max_window_layers"])
        mixers: list[Mixer] = ["sliding" if i >= first else "attention" for i in range(n)]
        return mixers, window if "sliding" in mixers else None
    if window and model in ("mistral", "mixtral"):
        return ["sliding"] * n, window
    return ["attention"] * n, None


def _is_moe(c: dict[str, Any], i: int) -> bool:
    if i in (c.get("mlp_only_layers") or ()):
        return False
    listed = c.get("moe_layers")
    if isinstance(listed, list):
        return i in listed
    if c.get("interleave_moe_layer_step"):
        return (i + 1) % int(c["interleave_moe_layer_step"]) == 0
    if c.get("expert_layer_period"):
        return i % int(c["expert_layer_period"]) == _int(c, "expert_layer_offset")
    if "first_k_dense_replace" in c or "moe_layer_freq" in c:
        freq = _int(c, "moe_layer_freq") or 1
        return i >= _int(c, "first_k_dense_replace") and i % freq == 0
    if "moe_layer_start_index" in c or "moe_layer_interval" in c:
        start = c.get("moe_layer_start_index") or 0
        end = c.get("moe_layer_end_index")
        start, end = (start[0], end[0] if isinstance(end, list) else end) if isinstance(start, list) else (start, end)
        interval = _int(c, "moe_layer_interval") or 1
        return (i + 1) % interval == 0 and i >= int(start) and (end is None or int(end) < 0 or i <= int(end))
    if c.get("decoder_sparse_step"):
        return (i + 1) % int(c["decoder_sparse_step"]) == 0
    return True


def _shared_size(c: dict[str, Any], expert: int) -> int:
    """Shared experts' intermediate size: Qwen's one shared expert of its own size, DeepSeek's / ERNIE's
    n_shared x the routed size, Llama 4's single shared expert of the routed size."""
    if c.get("shared_expert_intermediate_size"):
        return int(c["shared_expert_intermediate_size"])
    n = _int(c, "n_shared_experts", "num_shared_experts", "moe_num_shared_experts")
    if n:
        return n * expert
    if str(c.get("model_type", "")).startswith("llama4"):
        return expert
    return 0


PATTERN: dict[str, tuple[Mixer, Mlp]] = {"M": ("mamba", "none"), "*": ("attention", "none"), "-": ("none", "dense"),
                                         "E": ("none", "moe")}


def _pattern(c: dict[str, Any], pattern: str) -> Stack:
    unknown = sorted(set(pattern) - set(PATTERN))
    if unknown:
        raise ValueError(f"hybrid_override_pattern has block types {unknown} the planner does not know")
    n_exp = experts(c)
    dense = _int(c, "intermediate_size")
    expert = _int(c, "moe_intermediate_size", "intermediate_size")
    shared = _int(c, "moe_shared_expert_intermediate_size") or _shared_size(c, expert)
    layers = []
    for ch in pattern:
        mixer, mlp = PATTERN[ch]
        size = expert if mlp == "moe" else dense if mlp == "dense" else 0
        layers.append(Layer(mixer, mlp, size, shared if mlp == "moe" else 0))
    used = _int(c, "num_experts_per_tok", "moe_k") or 1
    return Stack(tuple(layers), experts=n_exp if "E" in pattern else 0, experts_used=used if "E" in pattern else 0)


def layer_list(c: dict[str, Any]) -> Stack:
    """The decoder stack of a text config (a multimodal config's `text_config` merged in already)."""
    n = int(c["num_hidden_layers"])
    pattern = c.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        if len(pattern) != n:
            raise ValueError(f"hybrid_override_pattern has {len(pattern)} blocks, num_hidden_layers {n}")
        return _pattern(c, pattern)
    mixers, window = _mixers(c, n)
    n_exp = experts(c)
    dense = _int(c, "intermediate_size_mlp", "intermediate_size", "ffn_dim", "n_inner")
    if not n_exp:
        return Stack(tuple(Layer(m, "dense", dense) for m in mixers), window=window)
    expert = _int(c, "moe_intermediate_size", "expert_intermediate_size", "intermediate_size")
    shared = _shared_size(c, expert)
    used = _int(c, "num_experts_per_tok", "num_experts_per_token", "moe_k", "top_k") or 1
    layers = tuple(
        Layer(m, "moe", expert, shared) if _is_moe(c, i) else Layer(m, "dense", dense) for i, m in enumerate(mixers)
    )
    return Stack(layers, experts=n_exp, experts_used=used, window=window)
