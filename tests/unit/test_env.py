"""Environment variables: declared once in platform/env.py and read only there; values are typed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dsgraph.platform import env

REPO = Path(__file__).resolve().parents[2]
SOURCE_FOLDERS = ("api", "graph", "ops", "models", "platform", "runtime", "tools")


def _reads(path: Path) -> list[str]:
    """`os.environ` / `os.getenv` uses in a file (any read, get or subscript), as `file:line`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        is_environ = isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
        if is_environ and isinstance(node.value, ast.Name) and node.value.id == "os":
            found.append(f"{path.relative_to(REPO)}:{node.lineno}")
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(a.name in ("environ", "getenv") for a in node.names):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_only_the_env_module_reads_the_environment() -> None:
    files = [p for folder in SOURCE_FOLDERS for p in (REPO / folder).rglob("*.py")]
    assert len(files) > 100
    reads = [r for p in files if p != REPO / "platform" / "env.py" for r in _reads(p)]
    assert reads == [], f"read the environment through dsgraph.platform.env (declared there): {reads}"


def test_values_are_typed_and_bad_ones_are_named() -> None:
    assert env.read("DSGRAPH_SIDE_STREAM", {}) is True
    assert env.read("DSGRAPH_SIDE_STREAM", {"DSGRAPH_SIDE_STREAM": "0"}) is False
    assert env.read("DSGRAPH_ENGRAM_HOST_MIN_BYTES", {"DSGRAPH_ENGRAM_HOST_MIN_BYTES": "4096"}) == 4096
    assert env.read("DSGRAPH_ENGRAM_HOST_MIN_BYTES", {"DSGRAPH_ENGRAM_HOST_MIN_BYTES": ""}) == 1 << 30
    with pytest.raises(ValueError, match=r"DSGRAPH_ENGRAM_HOST_MIN_BYTES='1G': expected an integer"):
        env.read("DSGRAPH_ENGRAM_HOST_MIN_BYTES", {"DSGRAPH_ENGRAM_HOST_MIN_BYTES": "1G"})
    with pytest.raises(ValueError, match=r"DSGRAPH_SIDE_STREAM='maybe': expected one of"):
        env.read("DSGRAPH_SIDE_STREAM", {"DSGRAPH_SIDE_STREAM": "maybe"})
    with pytest.raises(KeyError, match="DSGRAPH_NOPE is not declared"):
        env.read("DSGRAPH_NOPE", {})


def test_values_are_read_when_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DSGRAPH_ENGRAM_HOST_MIN_BYTES", "123")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    from dsgraph.platform.cuda import placement

    assert placement.host_min_bytes() == 123 and placement.host_min_bytes(7) == 7
    assert env.cache_home() == tmp_path
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert env.cache_home() == Path.home() / ".cache"


def test_the_dead_kernel_switch_is_gone() -> None:
    assert "DSGRAPH_CUDA_KERNELS" not in env.VARS
    for folder in SOURCE_FOLDERS:
        for p in (REPO / folder).rglob("*.py"):
            assert "DSGRAPH_CUDA_KERNELS" not in p.read_text(), p
