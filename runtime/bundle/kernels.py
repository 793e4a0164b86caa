"""The kernel binaries of a bundle: Triton's cache folder as the compile's warm-up filled it (one folder
per compiled kernel specialization, holding its cubin and metadata). On cpu there are none.

Triton finds a cached kernel through a group file (`__grp__<name>.json`) listing the absolute paths of
its files, and treats a group whose files are not at those paths as a miss (it compiles again). The
paths written at compile name the compile's own folder, so every copy of the folder must have them
pointed at itself (`repoint_groups`) before Triton reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["kernel_summary", "repoint_groups"]

GROUP_PREFIX = "__grp__"


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
        "note": "Triton's cache, filled by running every bucket an engine step can reach",
    }


def repoint_groups(folder: Path) -> int:
    """Rewrites the file paths of every Triton group file under `folder` to the files beside it (a
    group's files live in the group file's own folder); returns how many groups it rewrote. A group
    naming a file that is not there is left as it is, so Triton sees it as the miss it is."""
    changed = 0
    for group in sorted(folder.rglob(f"{GROUP_PREFIX}*.json")):
        data = json.loads(group.read_text())
        children = data.get("child_paths")
        if not isinstance(children, dict):
            continue
        local = {name: str(group.parent / Path(path).name) for name, path in children.items()}
        if local != children and all(Path(p).is_file() for p in local.values()):
            group.write_text(json.dumps({**data, "child_paths": local}))
            changed += 1
    return changed
