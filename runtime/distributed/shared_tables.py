"""The Engram tables once per node: the node's first rank writes each table into a file of the node's
shared folder (under /dev/shm where it exists: memory, not disk), and every rank of the node maps that
file MAP_SHARED in place of its own copy. The ranks' sessions then read one set of pages; each rank's
private copy from the checkpoint load is dropped once the mapped tensor replaces it. On a GPU the
platform pins the mapped pages in place (platform/cuda/placement.py), so the rows still travel from one
host copy per node.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dsgraph.platform.registry import is_host_table

SHM = Path("/dev/shm")
CHUNK = 1 << 26


def node_folder() -> str:
    """A fresh folder for one node's shared tables (the launcher removes it with `remove`)."""
    return tempfile.mkdtemp(prefix="dsgraph-ep-", dir=str(SHM) if SHM.is_dir() else None)


def remove(folder: str | None) -> None:
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def _write(path: Path, t: torch.Tensor) -> None:
    flat = t.contiguous().view(torch.uint8).reshape(-1)
    with open(path, "wb") as f:
        for at in range(0, flat.numel(), CHUNK):  # no second whole copy of a table in memory
            f.write(flat[at : at + CHUNK].numpy().data)


def map_table(path: Path, like: torch.Tensor) -> torch.Tensor:
    """The file at `path` as a tensor of `like`'s shape and dtype, its pages shared with every mapper."""
    n = like.numel()
    if n == 0:
        return like
    return torch.from_file(str(path), shared=True, size=n, dtype=like.dtype).reshape(like.shape)


def share_tables(
    weights: Mapping[str, torch.Tensor], folder: str, first_on_node: bool, group: Any = None
) -> dict[str, torch.Tensor]:
    """`weights` with every Engram table (and its row scales) mapped from `folder`. Every rank of the
    group calls this at once. The files are unlinked once every rank mapped them, so their memory goes
    back when the last rank ends, however it ends."""
    names = sorted(n for n in weights if is_host_table(n))
    root = Path(folder)
    if first_on_node:
        for n in names:
            _write(root / n, weights[n].cpu())
    dist.barrier(group=group)
    out = dict(weights)
    for n in names:
        out[n] = map_table(root / n, weights[n])
    dist.barrier(group=group)
    if first_on_node:
        for n in names:
            (root / n).unlink()
    return out
