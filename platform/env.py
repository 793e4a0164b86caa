"""Every environment variable dsgraph reads: declared here once with its type, default and meaning, and
read only through `read` (tests/unit/test_env.py fails on any other `os.environ` / `os.getenv` read).

Environment variables are for deployment and debugging switches only; an option that shapes results is
a typed config field (`EngineConfig`). Each is read when asked, never at import, so a value set after
import (a test, a launcher) is seen. A value of the wrong type fails naming the variable and what it
expects. This module imports nothing of dsgraph, so every layer (platform, runtime, tools) may use it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "VARS",
    "EnvVar",
    "cache_home",
    "child_environ",
    "engram_host_min_bytes",
    "native_replay",
    "pdl",
    "read",
    "set_peer_defaults",
    "set_triton_cache_dir",
    "side_stream",
    "triton_interpreting",
]


@dataclass(frozen=True)
class EnvVar:
    name: str
    kind: type  # bool, int or str
    default: bool | int | str
    doc: str


VARS: dict[str, EnvVar] = {
    v.name: v
    for v in (
        EnvVar(
            "DSGRAPH_SIDE_STREAM",
            bool,
            True,
            "cuda: gather host-resident Engram rows on a side stream that overlaps the first layers "
            "(0 keeps one stream)",
        ),
        EnvVar(
            "DSGRAPH_NATIVE_REPLAY",
            bool,
            True,
            "cuda: captured buckets are launched from the C++ runtime in one call per step (0: each "
            "graph replayed from Python; for measuring the difference)",
        ),
        EnvVar(
            "DSGRAPH_PDL",
            bool,
            False,
            "cuda, sm_90 and later: 1 launches the Triton kernels with programmatic dependent launch (a "
            "kernel starts while the one before it finishes; the decode GEMMs prefetch their first weight "
            "bytes before they wait). Off by default: the bench model's decode step was slower with it on an "
            "H100 (bench/results/pdl-ab-H100-f248b22.json). Results are the same bits either way",
        ),
        EnvVar(
            "DSGRAPH_ENGRAM_HOST_MIN_BYTES",
            int,
            1 << 30,
            "cuda: Engram tables of at least this many bytes stay in pinned host memory (a huge value keeps "
            "every table on the device)",
        ),
        EnvVar(
            "DSGRAPH_COMMIT", str, "", "bench: the commit its results record (default: git rev-parse HEAD)"
        ),
        EnvVar(
            "XDG_CACHE_HOME",
            str,
            "",
            "the cache folder of the embedded tiny checkpoint and the throughput curves (default ~/.cache)",
        ),
        EnvVar("MASTER_ADDR", str, "", "expert parallelism: node 0's address (torchrun's variable)"),
        EnvVar("MASTER_PORT", int, 0, "expert parallelism: node 0's port (torchrun's variable)"),
        EnvVar(
            "DSGRAPH_EP_SECRET",
            str,
            "",
            "expert parallelism over several nodes: the key both ends of the request channel prove (default: "
            "one derived from the rendezvous address)",
        ),
        EnvVar("RANK", int, -1, "expert parallelism under torchrun: this process's rank"),
        EnvVar("WORLD_SIZE", int, 0, "expert parallelism under torchrun: the number of ranks"),
        EnvVar(
            "TRITON_INTERPRET",
            bool,
            False,
            "Triton's own: kernels run under its CPU interpreter (the cuda tests on a machine without a GPU)",
        ),
        EnvVar(
            "TRITON_CACHE_DIR",
            str,
            "",
            "Triton's own: where compiled kernels are cached (a bundle's session points it at the bundle's "
            "kernels; default ~/.triton/cache)",
        ),
    )
}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def read(name: str, environ: Mapping[str, str] | None = None) -> bool | int | str:
    """The value of declared variable `name` (its default when unset or empty) from `environ` (default:
    the process environment)."""
    if name not in VARS:
        raise KeyError(f"environment variable {name} is not declared in dsgraph.platform.env.VARS")
    var = VARS[name]
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return var.default
    if var.kind is bool:
        if raw.lower() not in (*_TRUE, *_FALSE):
            raise ValueError(f"{name}={raw!r}: expected one of {_TRUE + _FALSE}")
        return raw.lower() in _TRUE
    if var.kind is int:
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r}: expected an integer") from None
    return raw


def side_stream() -> bool:
    return bool(read("DSGRAPH_SIDE_STREAM"))


def native_replay() -> bool:
    return bool(read("DSGRAPH_NATIVE_REPLAY"))


def pdl() -> bool:
    return bool(read("DSGRAPH_PDL"))


def engram_host_min_bytes() -> int:
    return int(read("DSGRAPH_ENGRAM_HOST_MIN_BYTES"))


def cache_home() -> Path:
    """$XDG_CACHE_HOME, or ~/.cache."""
    return Path(str(read("XDG_CACHE_HOME")) or Path.home() / ".cache")


def set_triton_cache_dir(path: Path) -> None:
    """Point Triton's kernel cache at `path` for this process (read by Triton at each compile or cache
    lookup, so it must be set before the first kernel launches)."""
    os.environ["TRITON_CACHE_DIR"] = str(path)


def set_peer_defaults(values: Mapping[str, str]) -> None:
    """Set another engine's own variables (a peer run by a bench in this process, e.g. vLLM) where the
    user has not: they belong to that engine, so they are not declared in VARS and dsgraph never reads
    them."""
    for name, value in values.items():
        os.environ.setdefault(name, value)


def child_environ(**overrides: str) -> dict[str, str]:
    """This process's environment with declared variables overridden, for a child process."""
    unknown = sorted(set(overrides) - set(VARS))
    if unknown:
        raise KeyError(f"environment variables {unknown} are not declared in dsgraph.platform.env.VARS")
    return {**os.environ, **overrides}


def triton_interpreting() -> bool:
    return bool(read("TRITON_INTERPRET"))
