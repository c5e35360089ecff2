"""An offline character-level tokenizer for the tiny random-init text backbones.

Real backbones use their own tokenizer; the tiny test models need one that builds without network access.
Every lowercase letter, digit and common punctuation mark is a WordPiece token (with its ``##`` continuation),
so any English sentence tokenizes character by character with the standard BERT special tokens.
"""

from __future__ import annotations

import string
import tempfile
from functools import lru_cache
from pathlib import Path

from transformers import BertTokenizerFast

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CHARS = string.ascii_lowercase + string.digits + string.punctuation


def char_vocab() -> list[str]:
    return SPECIAL + list(CHARS) + ["##" + c for c in CHARS]


@lru_cache(maxsize=1)
def char_tokenizer() -> BertTokenizerFast:
    """A BertTokenizerFast over ``char_vocab()`` (vocab size 193, pad id 0)."""
    with tempfile.TemporaryDirectory() as tmp:
        vocab = Path(tmp) / "vocab.txt"
        vocab.write_text("\n".join(char_vocab()) + "\n")
        tok = BertTokenizerFast(vocab_file=str(vocab), do_lower_case=True)
    tok.padding_side = "right"
    return tok
