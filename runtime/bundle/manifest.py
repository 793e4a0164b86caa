"""A bundle's manifest (`manifest.json`): what built it (dsgraph version and commit, torch, Triton and CUDA
versions, the GPU architecture or "cpu"), for what (the model config's hash, every EngineConfig field that
changes compiled output, the EP size), the bucket list per step kind, and a sha256 per file. The manifest
carries a checksum of its own content, so an edit by hand is seen as one."""

from __future__ import annotations

import hashlib
import json
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from dsgraph.platform import env

__all__ = [
    "COMPILED_FIELDS",
    "FORMAT",
    "MANIFEST",
    "VERSION",
    "config_hash",
    "current_environment",
    "file_checksums",
    "manifest_checksum",
    "read_manifest",
    "sha256_file",
    "source_commit",
    "write_manifest",
]

FORMAT = "dsgraph.bundle"
VERSION = 1
MANIFEST = "manifest.json"
# EngineConfig options (by their flat names, `EngineConfig.flat`) a bundle's graphs, buckets or cache
# sizes depend on: numerics and geometry shape the traced graph, max_num_seqs / cache_budget_bytes the
# cache dims every bucket is specialized to, the token and sequence limits the bucket list, truncation
# and drafting which graph variants exist.
COMPILED_FIELDS = (
    "numerics",
    "platform",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "page_size",
    "cache_budget_bytes",
    "prefill_truncation",
    "speculative",
    "engine_type",
    "deterministic",
)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def source_commit() -> str:
    """The git commit of the checkout this package runs from (DSGRAPH_COMMIT overrides), or "unknown"."""
    if env.read("DSGRAPH_COMMIT"):
        return str(env.read("DSGRAPH_COMMIT"))
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True, timeout=10
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# the subpackages whose code decides a graph, its lowering or its kernels
SOURCE_PACKAGES = ("graph", "ops", "models", "platform", "runtime")


def source_hash() -> str:
    """sha256 of the Python sources of SOURCE_PACKAGES as installed: catches an edit the commit does not
    name (a work tree with changes, an install without git)."""
    import importlib

    h = hashlib.sha256()
    for name in SOURCE_PACKAGES:
        for folder in importlib.import_module(f"dsgraph.{name}").__path__:
            for path in sorted(Path(folder).rglob("*.py")):
                h.update(f"{name}/{path.relative_to(folder).as_posix()}\0".encode())
                h.update(path.read_bytes())
    return h.hexdigest()


def _arch(platform: str) -> str:
    if platform != "cuda":
        return "cpu"
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor} ({torch.cuda.get_device_name()})"


def current_environment(platform: str) -> dict[str, Any]:
    """What this process would build with: versions, commit and the device architecture."""
    import torch

    return {
        "dsgraph": _version("dsgraph") or "0+unknown",
        "commit": source_commit(),
        "source": source_hash(),
        "torch": torch.__version__,
        "triton": _version("triton") if platform == "cuda" else None,
        "cuda": torch.version.cuda if platform == "cuda" else None,
        "arch": _arch(platform),
    }


def config_hash(model_dir: Path) -> str:
    """sha256 of the model's config.json, key order and whitespace aside."""
    data = json.loads((model_dir / "config.json").read_text())
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_checksums(root: Path) -> dict[str, str]:
    """Every file under `root` but the manifest, by its relative path."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in files}


def manifest_checksum(manifest: dict[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def write_manifest(root: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Adds the files' checksums and the manifest's own, and writes it; returns what was written."""
    full = {**manifest, "files": file_checksums(root)}
    full["manifest_sha256"] = manifest_checksum(full)
    (root / MANIFEST).write_text(json.dumps(full, indent=1, sort_keys=True) + "\n")
    return full


def read_manifest(root: Path) -> dict[str, Any]:
    """The manifest of the bundle at `root`; ValueError naming the path when there is none or it is not
    a dsgraph bundle manifest."""
    path = root / MANIFEST
    if not path.is_file():
        raise ValueError(f"bundle {root}: no {MANIFEST} (not a bundle; make one with `dsgraph compile`)")
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"bundle {root}: {MANIFEST} is not JSON ({exc}); compile the bundle again") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"bundle {root}: {MANIFEST} is not a {FORMAT} manifest")
    return data
