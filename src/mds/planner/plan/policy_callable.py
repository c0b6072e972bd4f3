"""A user's policy, named "package.module:function" in the config: imported with
importlib (never eval) and called as `function(window, history)` (docs/online-mixing.md).
Any exception it raises becomes one PlanError line naming the policy and the window."""

from __future__ import annotations

import importlib
from typing import Any

from mds.errors import PlanError

__all__ = ["call_policy", "load_policy"]


def load_policy(name: str, what: str) -> Any:
    """The callable `name` = "package.module:function" names."""
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an ImportError, or the module's own error at import
        raise PlanError(f"{what}: cannot import {module_name!r} ({type(exc).__name__}: {exc})") from None
    func = getattr(module, attr, None)
    if not callable(func):
        raise PlanError(f"{what}: {module_name!r} has no callable {attr!r}")
    return func


def call_policy(name: str, window: int, history: Any, what: str) -> Any:
    """The weights the user's policy returns for `window` (checked by the caller)."""
    func = load_policy(name, what)
    try:
        return func(window, history)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise PlanError(f"{what} raised {type(exc).__name__}: {first}") from None
