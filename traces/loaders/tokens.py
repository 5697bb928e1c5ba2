"""Text -> token counts for the conversation datasets.

A real tokenizer is used when one is installed and available offline; otherwise a documented
approximation. The name of what was used is recorded in the workload's metadata
(``loader.tokenizer``).

* ``hf:NAME`` -- a Hugging Face tokenizer (``transformers.AutoTokenizer``) from the local cache
  only (``local_files_only=True``; no download at run time).
* ``tiktoken:NAME`` -- an OpenAI ``tiktoken`` encoding (e.g. ``cl100k_base``), if its files are
  available locally.
* ``approx`` -- :func:`approx_token_count`: OpenAI's rule of thumb of ~4 characters per token
  for English text (``ceil(ascii_chars / 4)``) plus one token per non-ASCII character (CJK and
  other scripts tokenise at roughly one token per character in BPE vocabularies such as
  Llama's); at least 1 token for a non-empty text. Typical error on English chat text is
  +-15 % per message and a few percent on averages.
* ``auto`` (default) -- ``tiktoken:cl100k_base`` when tiktoken is installed and the encoding is
  in its local cache (``auto`` never downloads), else ``approx``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

APPROX_NAME = "approx:ascii/4+non-ascii"


def approx_token_count(text: str) -> int:
    """``ceil(ascii_chars / 4) + non_ascii_chars`` (>= 1 for a non-empty text, 0 for empty)."""
    if not text:
        return 0
    ascii_chars = len(text.encode("ascii", "ignore"))
    non_ascii = len(text) - ascii_chars
    return max(1, -(-ascii_chars // 4) + non_ascii)


@dataclass
class TokenCounter:
    """Counts tokens of many texts with one tokenizer; ``name`` says which."""

    name: str
    _encode: Callable[[str], int]

    def count(self, texts: Sequence[str]) -> np.ndarray:
        return np.fromiter((self._encode(t or "") for t in texts), dtype=np.int64, count=len(texts))


def _hf(name: str) -> TokenCounter:
    from transformers import AutoTokenizer  # type: ignore

    tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
    return TokenCounter(f"hf:{name}", lambda t: len(tok.encode(t, add_special_tokens=False)))


def _tiktoken(name: str) -> TokenCounter:
    import tiktoken  # type: ignore

    enc = tiktoken.get_encoding(name)
    return TokenCounter(f"tiktoken:{name}", lambda t: len(enc.encode(t, disallowed_special=())))


def _tiktoken_cached(name: str) -> bool:
    """Whether tiktoken's encoding file is in its local cache (so ``auto`` never downloads)."""
    import hashlib
    import os
    import tempfile

    url = f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
    base = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR") or \
        os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return os.path.exists(os.path.join(base, hashlib.sha1(url.encode()).hexdigest()))


def tokenizer_problem(spec: object) -> str | None:
    """What keeps the tokenizer ``spec`` from being used here (not text, an unknown kind, ``hf:``
    without a model name, a package that is not installed), or None; checked before a dataset is read."""
    if not isinstance(spec, str):
        return f"tokenizer={spec!r}: expected text: auto, approx, hf:NAME or tiktoken:NAME"
    spec = spec.strip() or "auto"
    kind, _, arg = spec.partition(":")
    if spec in ("auto", "approx") or (kind == "tiktoken" and importlib.util.find_spec("tiktoken") is not None):
        return None
    if kind == "hf":
        if not arg.strip():
            return f"tokenizer={spec!r}: name the Hugging Face tokenizer, e.g. hf:meta-llama/Llama-3.1-8B"
        if importlib.util.find_spec("transformers") is None:
            return (f"tokenizer={spec!r} needs the 'transformers' package (pip install transformers) and the "
                    f"tokenizer files in the local Hugging Face cache; or give tokenizer=approx")
        return None
    if kind == "tiktoken":
        return f"tokenizer={spec!r} needs the 'tiktoken' package (pip install tiktoken); or give tokenizer=approx"
    return f"unknown tokenizer {spec!r}: use auto, approx, hf:NAME or tiktoken:NAME"


def get_token_counter(spec: str = "auto") -> TokenCounter:
    """``auto`` | ``approx`` | ``hf:NAME`` | ``tiktoken:NAME`` (see the module docstring)."""
    spec = (spec or "auto").strip()
    if spec == "approx":
        return TokenCounter(APPROX_NAME, approx_token_count)
    kind, _, arg = spec.partition(":")
    if kind == "hf":
        if importlib.util.find_spec("transformers") is None:
            raise ImportError(tokenizer_problem(spec))
        return _hf(arg)
    if kind == "tiktoken":
        if importlib.util.find_spec("tiktoken") is None:
            raise ImportError(tokenizer_problem(spec))
        return _tiktoken(arg or "cl100k_base")
    if kind == "auto":
        if importlib.util.find_spec("tiktoken") is not None and _tiktoken_cached("cl100k_base"):
            try:
                return _tiktoken("cl100k_base")
            except Exception:  # unreadable cache: fall back
                pass
        return TokenCounter(APPROX_NAME, approx_token_count)
    raise ValueError(f"unknown tokenizer {spec!r}: use auto, approx, hf:NAME or tiktoken:NAME")
