"""Local Hugging Face tokenizers (`tokenizer.json`, extra `tokenizers`): the index counts
text with one, and the executor tokenizes with the same file."""

from __future__ import annotations

import functools
from pathlib import Path

from mds.executor.errors import ConfigError

__all__ = ["load_tokenizer"]


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str):
    """Load a local tokenizer.json; ConfigError if the package or the file is missing or bad."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConfigError(
            "`tokenizer` needs the `tokenizers` package: pip install 'mds-planner[tokenizers]'"
        ) from None
    if not Path(path).is_file():
        raise ConfigError(f"`tokenizer` file {path} not found")
    try:
        return Tokenizer.from_file(path)
    except Exception as exc:  # the library raises bare Exception for bad files
        raise ConfigError(f"`tokenizer` file {path} is not a tokenizer.json ({exc})") from None
