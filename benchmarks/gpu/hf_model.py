"""The local Qwen2 the AttnRL rows run on: random weights, a real-size vocabulary on a GPU, saved in bf16 (no hub)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HF_VOCAB = 151_643  # Qwen2's tokenizer size (DeepSeek-R1-Distill-Qwen-1.5B); the embedding is padded to 151,936


def build_hf_model(path: Path, vocab_size: int = HF_VOCAB, embedding_size: int = 151_936, hidden: int = 64,
                   save_dtype: str = "bfloat16") -> Path:
    """A small random-weight Qwen2 causal LM with a real-size vocabulary, saved locally (no hub) in ``save_dtype``,
    bf16 as DeepSeek-R1-Distill-Qwen-1.5B is stored (a loader that keeps the checkpoint's dtype then trains in pure
    bf16, which an fp32-saved model would hide). The tokenizer is byte-level like Qwen's (one token per byte, so
    newline, the step delimiter ``HFCodec`` looks for, is a token, and text round-trips), no merges, filler tokens
    up to ``vocab_size``; the logits are as wide as the 1.5B model's."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    byte_symbols = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(byte_symbols))}
    vocab.update({f"<|x{i}|>": i for i in range(len(vocab), vocab_size - 1)})
    vocab["<|endoftext|>"] = vocab_size - 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    cfg = Qwen2Config(vocab_size=max(embedding_size, vocab_size), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=True, eos_token_id=vocab_size - 1, pad_token_id=vocab_size - 1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        Qwen2ForCausalLM(cfg).to(getattr(torch, save_dtype)).save_pretrained(path)
    fast.save_pretrained(path)
    return path


@dataclass
class HFSetup:
    path: Path
    vocab: int
    embedding: int
    hidden: int


def hf_setup(workdir: Path, device: str) -> HFSetup:
    """A Qwen2-shaped model saved in bf16: the real vocabulary on a GPU; on a CPU one of 2,048, still wide enough
    next to the hidden size and sequence lengths that the logits dominate memory as they do at 151,936."""
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # one line per row
    big = device.startswith("cuda")
    setup = HFSetup(workdir / "qwen2-bf16", HF_VOCAB if big else 2048, 151_936 if big else 2048, 64 if big else 32)
    if not (setup.path / "config.json").exists():
        build_hf_model(setup.path, setup.vocab, setup.embedding, setup.hidden, save_dtype="bfloat16")
    return setup


def load_policy(setup: HFSetup, device: str):
    """The learner's policy (fp32 master weights, ``bf16: auto`` autocast) on ``device``."""
    from algos.attnrl.lm import load_hf_policy
    from algos.precision import use_bf16
    policy = load_hf_policy(str(setup.path), autocast_bf16=use_bf16("auto", device))
    policy.model.to(device)
    return policy
