"""The vision tower of a multimodal checkpoint, counted from its `vision_config`.

A ViT encoder: layers x (4 x width^2 (q, k, v, o) + MLP: 2 x width x intermediate, 3 x with a gated
(SiLU) MLP), the patch embedding (channels x patch^2 x width, x temporal patch for video towers) and
the position table ((image / patch)^2 x width); then the projector into the language model's width:
Llama 4's pixel-shuffle MLP (width / ratio^2 -> projector_input_dim -> projector_output_dim) and linear
into the text width, Llama 3.2 Vision's linear from `vision_output_dim` (its `num_global_layers` add to
the encoder's), Qwen-VL's merger (spatial_merge_size^2 x width -> that -> out_hidden_size),
otherwise a two-layer MLP (width -> text width -> text width, LLaVA's). Norms and biases are left out.
The tower's share of a large model is small (Llama 4: about 0.9B of 109B / 400B): an estimate within
a few percent of the tower is well within the 3 % the planner works to.
"""

from __future__ import annotations

from typing import Any

GATED = frozenset({"silu", "swiglu", "swish"})


def _get(c: dict[str, Any], *keys: str) -> int:
    for key in keys:
        if c.get(key):
            return int(c[key])
    return 0


def vision_params(v: dict[str, Any], text_hidden: int) -> int:
    width = _get(v, "hidden_size", "embed_dim", "width")
    layers = _get(v, "num_hidden_layers", "depth", "num_layers", "layers") + _get(v, "num_global_layers")
    if not width or not layers:
        return 0
    ratio = v.get("mlp_ratio")
    inter = _get(v, "intermediate_size") or (int(width * float(ratio)) if ratio else 4 * width)
    gated = str(v.get("hidden_act", "")).lower() in GATED
    per_layer = 4 * width * width + (3 if gated else 2) * width * inter
    patch = _get(v, "patch_size") or 14
    channels = _get(v, "num_channels", "in_channels", "in_chans") or 3
    embed = channels * patch * patch * width * (_get(v, "temporal_patch_size") or 1)
    image = _get(v, "image_size")
    positions = (image // patch) ** 2 * width if image else 0
    out = _get(v, "out_hidden_size") or text_hidden
    if v.get("pixel_shuffle_ratio") and v.get("projector_input_dim"):  # Llama 4
        shuffled = int(width / float(v["pixel_shuffle_ratio"]) ** 2)
        p_in = int(v["projector_input_dim"])
        p_out = _get(v, "projector_output_dim") or p_in
        projector = shuffled * p_in + p_in * p_out + _get(v, "vision_output_dim", "projector_output_dim") * text_hidden
    elif v.get("vision_output_dim"):  # Llama 3.2 Vision: the tower's output (several layers' concatenated) -> text
        projector = int(v["vision_output_dim"]) * text_hidden
    elif v.get("spatial_merge_size"):  # Qwen2-VL / Qwen2.5-VL merger
        merged = width * int(v["spatial_merge_size"]) ** 2
        projector = merged * merged + merged * out
    else:
        projector = width * text_hidden + text_hidden * text_hidden
    return layers * per_layer + embed + positions + projector
