"""src/mds/planner/index/config_file.py: a config read once (a named pipe too), unknown keys
refused with the closest known one, and paths placed against the config's directory."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from mds.errors import ConfigError
from mds.planner.index.config_file import check_keys, load_toml, place, read_whole


def test_an_unknown_key_names_the_closest_known_one() -> None:
    check_keys({"output": 1}, ("output", "workers"), "cfg: ")
    with pytest.raises(ConfigError, match=r"^cfg: unknown key `outptu`; did you mean `output`\?$"):
        check_keys({"outptu": 1}, ("output", "workers"), "cfg: ")
    with pytest.raises(ConfigError, match="unknown key `zzz`; expected one of output, workers$"):
        check_keys({"zzz": 1}, ("output", "workers"), "")


def test_load_toml_names_the_file_in_every_error(tmp_path: Path) -> None:
    path = tmp_path / "mds.toml"
    with pytest.raises(ConfigError, match="config file not found"):
        load_toml(path)
    path.write_text("[index\n")
    with pytest.raises(ConfigError, match=f"{path}: invalid TOML"):
        load_toml(path)
    path.write_bytes(b"\xef\xbb\xbfa = 1\n")  # a UTF-8 byte order mark is fine
    assert load_toml(path) == {"a": 1}


def test_a_named_pipe_is_read_whole(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe.toml"
    os.mkfifo(pipe)

    def write() -> None:
        with open(pipe, "wb") as f:
            f.write(b"a = 1\n")
            f.write(b"b = 2\n")

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert read_whole(pipe) == b"a = 1\nb = 2\n"
    finally:
        writer.join()


def test_place_resolves_paths_against_the_base_and_keeps_urls(tmp_path: Path) -> None:
    assert place(tmp_path, None) is None and place(tmp_path, "") is None
    assert place(tmp_path, "data/../idx") == (tmp_path / "idx").resolve()
    assert place(tmp_path, "s3://bucket/idx/") == "s3://bucket/idx"
