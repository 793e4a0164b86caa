"""The kernel binaries of a bundle: Triton's cache folder as the compile's warm-up filled it (one folder
per compiled kernel specialization, holding its cubin and metadata). On cpu there are none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["count_compiled", "kernel_summary"]


def _binaries(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.cubin")) if folder.is_dir() else []


def kernel_summary(folder: Path, platform: str, warmed: list[str]) -> dict[str, Any]:
    """What the manifest says about the kernels: none on cpu; on cuda each compiled kernel's name and
    binary size, and the step kinds whose buckets were run to compile them."""
    if platform != "cuda":
        return {"files": 0, "note": "cpu: the rules run torch operations, there are no kernels to compile"}
    found = _binaries(folder)
    files = [p for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []
    return {
        "files": len(files),
        "bytes": sum(p.stat().st_size for p in files),
        "warmed_kinds": warmed,
        "binaries": [{"name": p.stem, "bytes": p.stat().st_size, "dir": p.parent.name} for p in found],
        "note": "Triton's cache; a truncated-prefill bucket's kernels compile on its first step",
    }


def count_compiled(folder: Path | None) -> int:
    """Kernel binaries in a Triton cache folder (a bundle's session counts what it compiled itself)."""
    return 0 if folder is None else len(_binaries(folder))
