"""Small random LoRA adapters for a GGUF model, written with the `gguf` package, as llama.cpp loads them.

llama.cpp reads an adapter GGUF whose `general.type` is `adapter`, `adapter.type` is `lora`, whose
`general.architecture` is the base model's, with `adapter.lora.alpha` (the scale is alpha / rank
times the request's scale), and a pair of tensors per adapted weight: `<weight>.lora_a`
(ne [n_in, rank]) and `<weight>.lora_b` (ne [rank, n_out]) (llama-adapter.cpp checks these shapes
against the base tensor's ne [n_in, n_out])."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

ATTENTION = ("attn_q", "attn_k", "attn_v", "attn_output")


def make_lora(base: Path, out: Path, seed: int, rank: int = 4, alpha: float = 4.0, std: float = 0.08,
              targets: tuple[str, ...] = ATTENTION) -> Path:
    """A rank-`rank` adapter over every layer's `targets` of the GGUF at `base`, random normal(0, std)."""
    reader = gguf.GGUFReader(str(base))
    arch_field = reader.fields["general.architecture"]
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(alpha))
    for tensor in reader.tensors:
        stem = tensor.name.removesuffix(".weight")
        if not tensor.name.endswith(".weight") or stem.rsplit(".", 1)[-1] not in targets:
            continue
        n_in, n_out = (int(x) for x in tensor.shape[:2])
        # numpy shapes are the reverse of ggml's ne
        writer.add_tensor(f"{tensor.name}.lora_a", rng.normal(0, std, (rank, n_in)).astype(np.float32))
        writer.add_tensor(f"{tensor.name}.lora_b", rng.normal(0, std, (n_out, rank)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def make_peft_lora(out: Path, layers: int, hidden: int, q_out: int, v_out: int, seed: int, rank: int = 4,
                   std: float = 0.5) -> Path:
    """A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) over a llama's q_proj and
    v_proj, as vLLM and SGLang load them: `lora_A` is [rank, in], `lora_B` is [out, rank]."""
    import json

    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(layers):
        for name, width in (("q_proj", q_out), ("v_proj", v_out)):
            stem = f"base_model.model.model.layers.{i}.self_attn.{name}"
            tensors[f"{stem}.lora_A.weight"] = rng.normal(0, std, (rank, hidden)).astype(np.float32)
            tensors[f"{stem}.lora_B.weight"] = rng.normal(0, std, (width, rank)).astype(np.float32)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": rank, "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"], "bias": "none", "base_model_name_or_path": "tiny",
        "fan_in_fan_out": False, "modules_to_save": None}))
    return out
