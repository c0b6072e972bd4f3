"""What the object-storage tests share: a small Parquet + JSONL corpus, indexing and
planning one config per root, and replaying a plan to compare batches bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from builders import write_jsonl, write_parquet
from cli_helpers import mds
from executor_builders import batch_digest


def write_corpus(
    root: Path,
    seed: int,
    *,
    forum: str = "forum/forum.jsonl",
    row_group_size: int | None = 7,
    lang: bool = False,
) -> None:
    """Two Parquet parts of 30 token lists under web/ and 40 JSONL lines at `forum`."""
    rng = np.random.default_rng(seed)
    for part in range(2):
        columns: dict[str, Any] = {
            "tokens": [rng.integers(0, 500, int(rng.integers(4, 60))).tolist() for _ in range(30)]
        }
        if lang:
            columns["lang"] = ["en", "fr"] * 15
        kwargs = {"row_group_size": row_group_size} if row_group_size else {}
        write_parquet(root / "web" / f"part-{part}.parquet", columns, **kwargs)
    lines = [{"ids": rng.integers(0, 500, int(rng.integers(3, 40))).tolist()} for _ in range(40)]
    write_jsonl(root / forum, lines)


def corpus_config(
    *,
    web: str = "web/*.parquet",
    forum: str = "forum.jsonl",
    keep: str = "",
    steps: int = 8,
    dp_size: int = 2,
    micro_batches: int = 2,
    seed: int = 5,
    tail: str = "",
) -> str:
    """The config of the corpus of write_corpus, as a template whose `{root}` the caller
    fills; `tail`: more TOML after [train]."""
    keep = f"keep = {keep}\n" if keep else ""
    return f"""
[index]
root = "{{root}}"

[[source]]
name = "web"
path = "{web}"
tokens = "tokens"
{keep}weight = 0.6

[[source]]
name = "forum"
path = "{forum}"
tokens = "ids"
weight = 0.4

[train]
steps = {steps}
dp_size = {dp_size}
micro_batches = {micro_batches}
samples_per_step = {4 if dp_size == 1 else 8}
max_tokens_per_micro_batch = 400
seed = {seed}
{tail}"""


def index_and_plan(top: Path, name: str, config: str, *index_args: str) -> Path:
    """Write `config` as top/<name>.toml, index it to top/<name>-index and plan top/<name>.mds."""
    path = top / f"{name}.toml"
    path.write_text(config, encoding="utf-8")
    out = mds("index", path, "-o", top / f"{name}-index", *index_args)
    assert out.exit_code == 0, out.output
    out = mds("plan", path, "-o", top / f"{name}.mds", "--index", top / f"{name}-index")
    assert out.exit_code == 0, out.output
    return top / f"{name}.mds"


def replay(plan: Path | str, rank: int, **kwargs: Any) -> list[str]:
    """Digests of every micro-batch `rank` gets from `plan`, in one in-process run."""
    from mds.executor import PlanExecutor

    with PlanExecutor(plan, rank, **kwargs) as ex:
        return [batch_digest(b) for b in ex]


def assert_replays_as_local(local: Path, remote: Path, url: str) -> None:
    """The plan of the objects gives both ranks the local plan's batches, with and without a
    cache, and the local plan pointed at the store gives them too."""
    for rank in range(2):
        expected = replay(local, rank)
        assert replay(remote, rank) == expected
        assert replay(remote, rank, read_ahead=0, cache_bytes=1 << 10) == expected
        assert replay(local, rank, data_root=url) == expected
