"""An offline character-level tokenizer for the tiny random-init text backbones.

Real backbones use their own tokenizer; the tiny test models need one that builds without network access.
Every lowercase letter, digit and common punctuation mark is a WordPiece token (with its ``##`` continuation),
so any English sentence tokenizes character by character with the standard BERT special tokens.
"""

from __future__ import annotations

import string
from functools import lru_cache

from transformers import BertTokenizerFast

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CHARS = string.ascii_lowercase + string.digits + string.punctuation


def char_vocab() -> list[str]:
    return SPECIAL + list(CHARS) + ["##" + c for c in CHARS]


@lru_cache(maxsize=1)
def char_tokenizer() -> BertTokenizerFast:
    """A BertTokenizerFast over ``char_vocab()`` (vocab size 141, pad id 0)."""
    vocab = {token: i for i, token in enumerate(char_vocab())}
    tok = BertTokenizerFast(vocab=vocab, do_lower_case=True)
    tok.padding_side = "right"
    return tok
