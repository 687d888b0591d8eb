"""legion: runs trees of LLM agent sessions as an OTP-style supervision tree of OS processes."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__version__ = "0.1.0"


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` (PEP 562) that imports each public name from its submodule
    (``exports``: name -> submodule) on first use and keeps it, so importing one submodule never drags
    in the rest. Here, in the root package, because every component already imports it and no more."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
