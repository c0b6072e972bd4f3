"""Local Hugging Face tokenizers (`tokenizer.json`, extra `tokenizers`): the index counts
text with one, and the executor tokenizes with the same file."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mds.core import storage
from mds.core.fingerprint import fingerprint
from mds.errors import ConfigError, DataChangedError, install_hint

__all__ = ["index_tokenizer_path", "load_tokenizer"]


def index_tokenizer_path(source: str, facts: Mapping[str, Any], root: Path | str) -> Path:
    """The local tokenizer.json the index counted `source` with (its footer `fetch` facts,
    length kind "tokenizer"), checked to be that same file: ConfigError if it is in object
    storage or missing, DataChangedError if its content changed. The executor refuses to
    start on either; `mds verify` runs this same check so that it refuses them too."""
    length = facts.get("length") or {}
    path = Path(str(length.get("tokenizer")))
    if not path.is_absolute():
        path = storage.join(root, path.as_posix())
        if storage.is_url(path):
            raise ConfigError(
                f"source {source!r}: its tokenizer {path} is in object storage; pass "
                f"tokenize= (a function str -> token ids, or {{{source!r}: fn}})"
            )
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"`tokenizer` file {path} not found")
    recorded = facts.get("tokenizer_fingerprint")
    if recorded and fingerprint(path, "full") != recorded:
        raise DataChangedError(
            f"{path}: tokenizer of source {source!r} changed since indexing; re-index, or "
            "pass tokenize= explicitly"
        )
    return path


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str):
    """Load a local tokenizer.json; ConfigError if the package or the file is missing or bad."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConfigError(
            f"`tokenizer` needs the `tokenizers` package: {install_hint('tokenizers')}"
        ) from None
    if not Path(path).is_file():
        raise ConfigError(f"`tokenizer` file {path} not found")
    try:
        return Tokenizer.from_file(path)
    except Exception as exc:  # the library raises bare Exception for bad files
        raise ConfigError(f"`tokenizer` file {path} is not a tokenizer.json ({exc})") from None
