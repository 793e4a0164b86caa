"""Nested dicts/lists/tuples of leaves, flattened with dotted path names (like JAX pytrees)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Leaf = Any


def flatten(tree: Any, is_leaf: Callable[[Any], bool], prefix: str = "") -> list[tuple[str, Leaf]]:
    """(path, leaf) pairs in order: dicts in insertion order, sequences by index."""
    if is_leaf(tree):
        return [(prefix or "out", tree)]
    if isinstance(tree, dict):
        items = [(str(k), v) for k, v in tree.items()]
    elif isinstance(tree, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(tree)]
    else:
        raise TypeError(
            f"{prefix or 'argument'}: {type(tree).__name__} is neither a leaf nor a dict/list/tuple"
        )
    out: list[tuple[str, Leaf]] = []
    for key, value in items:
        out.extend(flatten(value, is_leaf, f"{prefix}.{key}" if prefix else key))
    return out


def map_leaves(
    tree: Any, is_leaf: Callable[[Any], bool], fn: Callable[[str, Leaf], Any], prefix: str = ""
) -> Any:
    """Same structure, each leaf replaced by fn(path, leaf)."""
    if is_leaf(tree):
        return fn(prefix or "out", tree)
    if isinstance(tree, dict):
        return {k: map_leaves(tree[k], is_leaf, fn, f"{prefix}.{k}" if prefix else str(k)) for k in tree}
    if isinstance(tree, (list, tuple)):
        seq = [map_leaves(v, is_leaf, fn, f"{prefix}.{i}" if prefix else str(i)) for i, v in enumerate(tree)]
        return type(tree)(seq) if isinstance(tree, tuple) else seq
    raise TypeError(f"{prefix or 'argument'}: {type(tree).__name__} is neither a leaf nor a dict/list/tuple")


def unflatten_like(tree: Any, is_leaf: Callable[[Any], bool], values: dict[str, Any]) -> Any:
    """Rebuild `tree`'s structure with the leaf at each path taken from `values`."""
    return map_leaves(tree, is_leaf, lambda path, _leaf: values[path])
