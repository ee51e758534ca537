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
