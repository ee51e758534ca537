"""Parameters counted layer by layer from the layer list.

embeddings:        vocab x hidden, doubled unless tie_word_embeddings
attention (GQA):   hidden x heads x head_dim (q; x2 with an output gate: Qwen3-Next) + 2 x hidden x kv_heads
                   x head_dim (k, v) + heads x head_dim x hidden (o); sliding layers the same
attention (MLA):   hidden x q_lora + q_lora x heads x (nope + rope)   (q, or hidden x heads x (nope + rope))
                   + hidden x (kv_lora + rope) + kv_lora x heads x (nope + v) + heads x v x hidden
Gated DeltaNet:    hidden x (2 x key_dim + 2 x value_dim) (q, k, v, z) + hidden x 2 x v_heads (b, a)
                   + conv (2 x key_dim + value_dim) x kernel + value_dim x hidden (out); key_dim =
                   linear_num_key_heads x linear_key_head_dim, value_dim likewise
Mamba (Jamba):     d_inner = expand x hidden: hidden x 2 d_inner (in) + d_inner x d_conv (conv) + d_inner x
                   (dt_rank + 2 d_state) (x) + dt_rank x d_inner (dt) + d_inner x d_state (A) + d_inner x hidden
Mamba-2:           d_inner = heads x head dim: hidden x (2 d_inner + 2 groups x d_state + heads) (in) + conv (d_inner + 2 groups x d_state)
                   x d_conv + d_inner x hidden (out)
gated MLP:         3 x hidden x intermediate (2 x for Nemotron-H's ungated `mlp_hidden_act`); an MoE layer holds `experts` of them + the shared expert(s)
                   + the router (hidden x experts), and reads `experts_used` + the shared per token
Norms and biases are left out (well under 0.1 % of any model here). Multi-token-prediction layers
(DeepSeek's `num_nextn_predict_layers`) are not in the total, as the published totals leave them out;
`mtp` counts them for the cross-check against checkpoints that ship them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.planning.stack.layers import Layer, Stack, layer_list
from gateway.planning.stack.vision import vision_params


UNGATED = frozenset({"relu2", "relu", "gelu_new"})
"""`mlp_hidden_act` of MLPs with an up and a down projection only (Nemotron-H's squared ReLU)."""


@dataclass(frozen=True)
class Params:
    total: int
    active: int
    """Read per token: every dense weight, the routed-in experts only; the vision tower is not (images only)."""
    embeddings: int
    """Input embeddings and lm_head (once when tied)."""
    experts: int
    """Routed-expert parameters (all experts, all MoE layers)."""
    vision: int = 0
    """The vision tower and its projector (in `total`)."""
    mtp: int = 0
    """Multi-token-prediction layers the checkpoint ships beside the model (not in `total`)."""
    stack: Stack | None = None


def _kv_heads(c: dict[str, Any], heads: int) -> int:
    for key in ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"):
        if c.get(key):
            return int(c[key])
    return 1 if c.get("multi_query") else heads


def _attention(c: dict[str, Any]) -> int:
    h, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    if c.get("kv_lora_rank"):
        nope, rope, v = int(c["qk_nope_head_dim"]), int(c["qk_rope_head_dim"]), int(c["v_head_dim"])
        qr = c.get("q_lora_rank")
        q = h * int(qr) + int(qr) * heads * (nope + rope) if qr else h * heads * (nope + rope)
        lora = int(c["kv_lora_rank"])
        return q + h * (lora + rope) + lora * heads * (nope + v) + heads * v * h
    hd = int(c.get("head_dim") or h // heads)
    gate = 2 if c.get("attn_output_gate", str(c.get("model_type", "")) == "qwen3_next") else 1
    return gate * h * heads * hd + 2 * h * _kv_heads(c, heads) * hd + heads * hd * h


def _linear_attention(c: dict[str, Any]) -> int:
    h = int(c["hidden_size"])
    heads = int(c["num_attention_heads"])
    k_heads = int(c.get("linear_num_key_heads") or heads)
    v_heads = int(c.get("linear_num_value_heads") or k_heads)
    key = k_heads * int(c.get("linear_key_head_dim") or c.get("head_dim") or h // heads)
    value = v_heads * int(c.get("linear_value_head_dim") or c.get("head_dim") or h // heads)
    kernel = int(c.get("linear_conv_kernel_dim") or 4)
    return h * (2 * key + 2 * value) + h * 2 * v_heads + (2 * key + value) * kernel + value * h


def _mamba(c: dict[str, Any]) -> int:
    h = int(c["hidden_size"])
    expand = int(c.get("mamba_expand") or c.get("expand") or 2)
    d_state = int(c.get("mamba_d_state") or c.get("ssm_state_size") or c.get("state_size") or 16)
    d_conv = int(c.get("mamba_d_conv") or c.get("conv_kernel") or 4)
    heads = c.get("mamba_n_heads") or c.get("mamba_num_heads")
    head_dim = c.get("mamba_d_head") or c.get("mamba_head_dim")
    if heads or head_dim:  # Mamba-2 (Bamba, Granite 4: mamba_n_heads ...; Nemotron-H: mamba_num_heads ...)
        n_heads = int(heads or expand * h // int(head_dim))
        inner = n_heads * int(head_dim or expand * h // n_heads)
        groups = int(c.get("mamba_n_groups") or c.get("n_groups") or 1)
        return h * (2 * inner + 2 * groups * d_state + n_heads) + (inner + 2 * groups * d_state) * d_conv + inner * h
    inner = expand * h
    rank = c.get("mamba_dt_rank") or c.get("time_step_rank") or "auto"
    dt_rank = -(-h // 16) if rank == "auto" else int(rank)
    return h * 2 * inner + inner * d_conv + inner * (dt_rank + 2 * d_state) + dt_rank * inner + inner * d_state + inner * h


def _mixer(c: dict[str, Any], layer: Layer, attention: int) -> int:
    if layer.mixer == "none":
        return 0
    if layer.mixer == "linear_attention":
        return _linear_attention(c)
    if layer.mixer == "mamba":
        return _mamba(c)
    return attention


def count(c: dict[str, Any], vision_config: dict[str, Any] | None = None) -> Params:
    """Total and active parameters of the decoder `c` (a multimodal config's text part) and its vision tower."""
    h = int(c["hidden_size"])
    vocab = int(c["vocab_size"])
    # transformers' default is model-specific: Gemma ties input and output embeddings
    tied = c.get("tie_word_embeddings", str(c.get("model_type", "")).startswith("gemma"))
    embed = vocab * h * (1 if tied else 2)
    stack = layer_list(c)
    attention = _attention(c) if any(layer.mixer in ("attention", "sliding") for layer in stack.layers) else 0
    total = active = embed
    routed = 0
    last = 0
    mats = 2 if str(c.get("mlp_hidden_act", "")).lower() in UNGATED else 3
    for layer in stack.layers:
        mixer = _mixer(c, layer, attention)
        if layer.mlp == "none":
            mlp = mlp_active = 0
        elif layer.mlp == "dense":
            mlp = mlp_active = mats * h * layer.mlp_size
        else:
            expert = mats * h * layer.mlp_size
            shared = mats * h * layer.shared_size
            router = h * stack.experts
            mlp = stack.experts * expert + shared + router
            mlp_active = stack.experts_used * expert + shared + router
            routed += stack.experts * expert
        total += mixer + mlp
        active += mixer + mlp_active
        last = mixer + mlp
    mtp_layers = int(c.get("num_nextn_predict_layers") or c.get("mtp_num_hidden_layers") or 0)
    vision = vision_params(vision_config, h) if vision_config else 0
    return Params(
        total=total + vision,
        active=active,
        embeddings=embed,
        experts=routed,
        vision=vision,
        mtp=mtp_layers * (last + 2 * h * h),
        stack=stack,
    )
