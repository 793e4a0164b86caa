"""A bundle's kernels are found by Triton where the bundle is opened, not only where it was compiled.

Triton's cache finds a kernel through a group file holding the absolute paths of the kernel's files; a
group whose paths are gone is a miss, and the kernel compiles again. A bundle's kernel folder is written
in the compile's own (temporary) folder and copied at every start, so without rewriting those paths a
bundle start compiles every kernel again (seen on the H200: 54 kernels compiled at a bundle start). These
tests drive Triton's own cache manager."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dsgraph.runtime.bundle.kernels import repoint_groups
from dsgraph.runtime.bundle.load import Bundle

cache = pytest.importorskip("triton.runtime.cache")


def _write_kernel(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One kernel in Triton's cache at `folder`, as Triton's compile writes it (files and their group)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folder))
    m = cache.FileCacheManager("kernelkey")
    paths = {
        "k.cubin": m.put(b"\x7fELF cubin", "k.cubin"),
        "k.json": m.put(json.dumps({"name": "k"}), "k.json", binary=False),
    }
    m.put_group("k.json", paths)


def _group(folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str] | None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(folder))
    return cache.FileCacheManager("kernelkey").get_group("k.json")


def test_a_moved_cache_misses_until_its_groups_are_repointed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_kernel(tmp_path / "compiled", monkeypatch)
    shutil.copytree(tmp_path / "compiled", tmp_path / "copy")
    shutil.rmtree(tmp_path / "compiled")
    assert _group(tmp_path / "copy", monkeypatch) == {}  # Triton's miss: it would compile again
    assert repoint_groups(tmp_path / "copy") == 1
    found = _group(tmp_path / "copy", monkeypatch)
    assert found is not None and set(found) == {"k.cubin", "k.json"}
    assert all(Path(p).parent.parent == tmp_path / "copy" for p in found.values())
    assert repoint_groups(tmp_path / "copy") == 0  # already local


def test_a_group_missing_a_file_stays_a_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_kernel(tmp_path / "compiled", monkeypatch)
    shutil.copytree(tmp_path / "compiled", tmp_path / "copy")
    shutil.rmtree(tmp_path / "compiled")
    next((tmp_path / "copy").rglob("k.cubin")).unlink()
    assert repoint_groups(tmp_path / "copy") == 0
    assert "k.cubin" not in (_group(tmp_path / "copy", monkeypatch) or {})


def test_point_kernels_gives_triton_the_bundles_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "bundle"
    _write_kernel(tmp_path / "bundle.partial" / "kernels", monkeypatch)
    (tmp_path / "bundle.partial").rename(root)  # what `dsgraph compile` does with its folder
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    bundle = Bundle(root, {"kernels": {"files": 3}, "manifest_sha256": "ab" * 32})
    dest = bundle.point_kernels()
    assert dest is not None and dest.is_relative_to(tmp_path / "home")
    found = _group(dest, monkeypatch)
    assert found is not None and set(found) == {"k.cubin", "k.json"}
    # the bundle's own files stay as compiled (their checksums are in the manifest)
    stale = json.loads(next(root.rglob("__grp__k.json")).read_text())["child_paths"]
    assert all("bundle.partial" in p for p in stale.values())
