"""The hijack set: token ids that count as "the model started answering yes/no" at the first answer position.

Rule, for each word in ``eval.hijack_words``:

1. variants: the word as written, lower-case, Capitalized and UPPER, each without and with a leading space;
2. a variant that encodes (no special tokens) to exactly one token contributes that token (unless it is the
   unknown token);
3. a variant that encodes to several tokens contributes its *first* token only if that token alone decodes
   (leading whitespace dropped) to a prefix of the variant of at least 2 characters — e.g. ``yes`` → ``ye`` + ``s``
   gives ``ye``, but ``No`` → ``N`` + ``o`` gives nothing, nor does a bare leading-space token. A model whose top-1
   is ``ye`` is on its way to "yes"; one whose top-1 is ``N`` may be starting any word;
4. the vocabulary's own word-initial forms are looked up directly as well: byte-level ``Ġ`` + variant and
   SentencePiece ``▁`` + variant, when they are tokens.

No torch: only the tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MIN_PREFIX_CHARS = 2
WORD_START_MARKERS = ("Ġ", "▁")


def casing_variants(word: str) -> list[str]:
    """The word as written, lower, Capitalized and UPPER, without duplicates, in that order."""
    out: list[str] = []
    for v in (word, word.lower(), word[:1].upper() + word[1:].lower(), word.upper()):
        if v and v not in out:
            out.append(v)
    return out


def hijack_token_ids(tokenizer: Any, words: Iterable[str]) -> set[int]:
    """Token ids of every casing / leading-space variant of ``words`` the tokenizer has (see the module rule)."""
    ids: set[int] = set()
    unk = getattr(tokenizer, "unk_token_id", None)
    vocab = tokenizer.get_vocab()
    for word in words:
        word = word.strip()
        for variant in casing_variants(word):
            for text in (variant, " " + variant):
                encoded = tokenizer.encode(text, add_special_tokens=False)
                if not encoded:
                    continue
                first = encoded[0]
                if first == unk:
                    continue
                if len(encoded) == 1:
                    ids.add(first)
                    continue
                piece = tokenizer.decode([first]).lstrip()
                if len(piece) >= MIN_PREFIX_CHARS and variant.startswith(piece):
                    ids.add(first)
            for marker in WORD_START_MARKERS:
                if marker == "Ġ" and not variant.isascii():
                    continue  # byte-level maps non-ASCII bytes to other characters; only ASCII maps to itself
                token_id = vocab.get(marker + variant)
                if token_id is not None and token_id != unk:
                    ids.add(token_id)
    return ids
