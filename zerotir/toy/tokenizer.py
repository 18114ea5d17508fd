"""A byte-level tokenizer built with the ``tokenizers`` library: one token per byte, so any text (tool output
included) is representable, and decode(encode(text)) == text.

Saved with ``save_pretrained`` it loads with ``AutoTokenizer`` in transformers and in vLLM alike.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS = "<pad>", "<s>", "</s>"


def build_byte_tokenizer(save_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """Return a byte-level tokenizer with ids 0..2 for <pad>, <s>, </s> and 3..258 for the 256 bytes.

    Args:
        save_dir: if given, the tokenizer is written there with ``save_pretrained``.
    """
    byte_chars = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda c: _byte_of(c))
    vocab = {PAD: 0, BOS: 1, EOS: 2}
    for ch in byte_chars:
        vocab[ch] = len(vocab)
    # BPE without merges over the byte alphabet = exactly one token per byte.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, clean_up_tokenization_spaces=False
    )
    if save_dir is not None:
        tok.save_pretrained(str(save_dir))
    return tok


def _byte_of(ch: str) -> int:
    """The byte value that GPT-2's byte-level alphabet maps to ``ch``."""
    code = ord(ch)
    if 33 <= code <= 126 or 161 <= code <= 172 or 174 <= code <= 255:
        return code
    # Bytes outside the printable ranges are mapped to 256 + k in GPT-2's table, in increasing byte order.
    unprintable = [b for b in range(256) if not (33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255)]
    return unprintable[code - 256]
