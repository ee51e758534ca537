"""Build a tiny random-weight llama model directory, offline, in the Hugging Face layout.

The same directory loads in `mlx_lm` and in vLLM: `config.json`, a byte-level BPE tokenizer
(trained here on a few sentences) wrapped in `PreTrainedTokenizerFast` with a chat template,
and float32 weights saved with `safetensors` under the HF llama names (which mlx_lm uses too).
Weights come from a fixed seed, so greedy output is the same on every run of one platform.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 128
VOCAB_TARGET = 320
CONTEXT = 512
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, this is a tiny model for tests",
    "a gateway serves many engines behind one openai api",
    "user assistant system say hi there",
] * 8


def _tokenizer(path: Path) -> list[bool]:
    """Train and save the tokenizer; returns, per token id, whether it decodes to printable ASCII."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", chat_template=CHAT_TEMPLATE
    )
    fast.save_pretrained(str(path))
    texts = [tok.decode([i]) for i in range(tok.get_vocab_size())]
    return [bool(t) and t.isascii() and t.isprintable() and i >= len(specials) for i, t in enumerate(texts)]


def _weights(printable: list[bool], seed: int, hidden: int, heads: int, kv_heads: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    vocab = len(printable)
    head_dim = hidden // heads

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.08).astype(np.float32)

    w: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rand(vocab, hidden),
        "model.norm.weight": np.ones(hidden, np.float32),
        # Rows of zeros for tokens that are not printable ASCII: their logit is 0 while the best
        # random one is positive, so greedy output is readable text (random bytes otherwise stay
        # buffered as partial UTF-8). EOS keeps a small chance under sampling.
        "lm_head.weight": rand(vocab, hidden) * np.asarray(printable, np.float32)[:, None],
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = np.ones(hidden, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
        w[p + "self_attn.q_proj.weight"] = rand(heads * head_dim, hidden)
        w[p + "self_attn.k_proj.weight"] = rand(kv_heads * head_dim, hidden)
        w[p + "self_attn.v_proj.weight"] = rand(kv_heads * head_dim, hidden)
        w[p + "self_attn.o_proj.weight"] = rand(hidden, heads * head_dim)
        w[p + "mlp.gate_proj.weight"] = rand(INTERMEDIATE, hidden)
        w[p + "mlp.up_proj.weight"] = rand(INTERMEDIATE, hidden)
        w[p + "mlp.down_proj.weight"] = rand(hidden, INTERMEDIATE)
    return w


def build_tiny_llama(path: Path, seed: int = 0, hidden: int = HIDDEN, heads: int = HEADS, kv_heads: int = KV_HEADS) -> Path:
    """Write the model into `path` (created) and return it.

    vLLM's CPU attention supports only some head sizes (16 is refused): its test asks for
    hidden 128 with 2 heads (head_dim 64)."""
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    printable = _tokenizer(path)
    vocab = len(printable)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "max_position_embeddings": CONTEXT,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    (path / "config.json").write_text(json.dumps(config, indent=1))
    save_file(_weights(printable, seed, hidden, heads, kv_heads), str(path / "model.safetensors"), metadata={"format": "pt"})
    return path
