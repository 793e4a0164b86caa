"""Names of a package loaded on first use (PEP 562): `import dsgraph` and `import dsgraph.runtime` stay
light (no torch) until a name is asked for."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

Getattr = Callable[[str], Any]


def lazy_names(package: str, where: Mapping[str, str]) -> tuple[Getattr, Callable[[], list[str]]]:
    """(`__getattr__`, `__dir__`) of `package`, whose name N lives in module `where[N]`."""

    def getattr_(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name]), name)

    def dir_() -> list[str]:
        return sorted(where)

    return getattr_, dir_
