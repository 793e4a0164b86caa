"""The files of a bundle: graphs as gzipped versioned JSON (graph/serialize.py), program texts gzipped,
small tables as JSON. Paths are relative to the bundle's root; gzip headers carry no time, so compiling
twice gives the same bytes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from dsgraph.graph import Graph
from dsgraph.graph.serialize import deserialize, serialize

__all__ = [
    "KERNELS",
    "graph_path",
    "read_graph",
    "read_json",
    "read_text",
    "symbolic_path",
    "text_path",
    "write_graph",
    "write_json",
    "write_text",
]

KERNELS = "kernels"  # the Triton cache folder (cuda)
TABLES = "tables.json"  # tuned tables: the throughput curve and the draft cost
PLACEMENT = "placement.json"  # expert placement of an expert-parallel bundle
CAPTURE = "capture.json"  # what capturing learnt (which rules can be captured), so a start does not probe


def graph_path(kind: str, bucket: str) -> str:
    return f"graphs/{kind}/{bucket}.json.gz"


def symbolic_path(kind: str) -> str:
    return f"graphs/{kind}/symbolic.json.gz"


def text_path(kind: str, bucket: str) -> str:
    return f"programs/{kind}/{bucket}.txt.gz"


def _write(root: Path, rel: str, data: bytes) -> int:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = gzip.compress(data, mtime=0)
    path.write_bytes(blob)
    return len(blob)


def write_graph(root: Path, rel: str, graph: Graph) -> int:
    """Writes the graph; returns the file's size in bytes."""
    return _write(root, rel, serialize(graph))


def write_text(root: Path, rel: str, text: str) -> int:
    return _write(root, rel, text.encode())


def read_graph(root: Path, rel: str) -> Graph:
    import dsgraph.ops  # noqa: F401  (params are rebuilt from the declared ops)

    return deserialize(gzip.decompress((root / rel).read_bytes()))


def read_text(root: Path, rel: str) -> str:
    return gzip.decompress((root / rel).read_bytes()).decode()


def write_json(root: Path, rel: str, data: Any) -> None:
    (root / rel).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def read_json(root: Path, rel: str) -> Any:
    return json.loads((root / rel).read_text())
