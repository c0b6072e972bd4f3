"""The executor's view of a plan's sources: `SourceCatalog` fetches samples as token ids,
checked against the plan; `Tokenize` is the type of a `tokenize=` function."""

from mds.executor.catalog.sources import SourceCatalog
from mds.executor.catalog.tokens import Tokenize

__all__ = ["SourceCatalog", "Tokenize"]
