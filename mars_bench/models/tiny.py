"""A tiny random target/draft pair for tests and CI: no downloads, built from configs with fixed seeds.

Tokenizer: byte-level (256 byte tokens + 3 specials), built offline with ``tokenizers``, with a
Qwen-style chat template. Target: a 2-layer Qwen2 model. Draft: the target's weights plus Gaussian
noise (so it agrees with the target often but not always), with its embedding matrix padded to a
larger size to exercise the vocabulary mapping.
"""
from __future__ import annotations

import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE)


def tiny_config(vocab_size: int, seed_layers: int = 2):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=seed_layers, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=2048, tie_word_embeddings=False,
                       initializer_range=0.15, eos_token_id=258, bos_token_id=None,
                       pad_token_id=256)


def tiny_shaped_config(vocab_size: int, shape: dict):
    """The tiny pair's config reshaped by ``shape`` (config attributes, e.g. the head size an engine's attention
    takes: an engine's ``engine.tiny_shape``, conf/engine/<name>.yaml)."""
    shape = dict(shape)
    c = tiny_config(vocab_size, seed_layers=shape.pop("num_hidden_layers", 2))   # sizes its per-layer lists
    for key, value in shape.items():
        setattr(c, key, value)
    return c


def tiny_pair(seed: int = 0, noise: float = 0.05, draft_pad: int = 13, dtype=torch.float32):
    """(target, draft, tokenizer). Same seed -> same weights, on any machine."""
    from transformers import Qwen2ForCausalLM

    tokenizer = tiny_tokenizer()
    vocab = len(tokenizer)
    torch.manual_seed(seed)
    target = Qwen2ForCausalLM(tiny_config(vocab)).to(dtype).eval()
    draft = Qwen2ForCausalLM(tiny_config(vocab + draft_pad)).to(dtype).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        src = target.state_dict()
        for name, p in draft.state_dict().items():
            t = src[name]
            rows = slice(0, t.shape[0])
            p[rows].copy_(t + noise * t.std() * torch.randn(t.shape, generator=gen).to(dtype))
    return target, draft, tokenizer
