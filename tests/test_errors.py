"""The error tree's helpers for optional extras: one wording for every install hint, and a
missing optional package as one line naming the extra, never a bare ModuleNotFoundError."""

from __future__ import annotations

import pytest

import mds
from mds.errors import (
    EXTRAS,
    MdsError,
    MissingExtraError,
    install_hint,
    missing_extra,
    needs_extra,
)


def test_install_hint_names_the_checkout_and_the_wheel():
    assert install_hint("plan,ray") == (
        "pip install '.[plan,ray]' in the mds checkout (or pip install "
        f"'dist/mds_planner-{mds.__version__}-py3-none-any.whl[plan,ray]' after make dist)"
    )


def test_missing_extra_is_one_line_naming_the_extra():
    error = missing_extra(ModuleNotFoundError("No module named 'PIL'", name="PIL.Image"))
    assert isinstance(error, MdsError) and isinstance(error, ImportError)
    assert str(error) == f"this command needs PIL, which is not installed: {install_hint('vision')}"
    assert "\n" not in str(error)
    assert missing_extra(ModuleNotFoundError("x", name="no_such_module")) is None
    assert missing_extra(ModuleNotFoundError("x")) is None
    assert set(EXTRAS.values()) <= {"plan", "train", "tokenizers", "vision", "lightning", "hf",
                                    "megatron", "s3", "ray"}


def test_needs_extra_turns_a_missing_package_into_one_line(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "torch", None)
    with pytest.raises(MissingExtraError) as info, needs_extra("my.module", "lightning"):
        import torch  # noqa: F401
    assert str(info.value) == (
        f"my.module needs torch, which is not installed: {install_hint('lightning')}"
    )
    # a package of another extra is named with its own
    monkeypatch.setitem(__import__("sys").modules, "PIL", None)
    with pytest.raises(MissingExtraError, match=r"\[vision\]"), needs_extra("x", "train"):
        import PIL  # noqa: F401
    # a module of no extra is a bug: its error passes unchanged
    with pytest.raises(ModuleNotFoundError) as bug, needs_extra("my.module"):
        import mds.no_such_module  # noqa: F401
    assert not isinstance(bug.value, MdsError)
