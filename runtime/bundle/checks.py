"""Whether a bundle fits this machine and this run: every mismatch at once, each with what to do.

A bundle is built for one cluster shape (platform, GPU architecture, EP size) and one configuration; a
run that differs is refused with `BundleMismatchError`, never rebuilt behind the user's back."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dsgraph.runtime.bundle.manifest import FORMAT, VERSION, manifest_checksum, sha256_file

__all__ = ["BundleMismatchError", "check_environment", "check_files", "check_run", "raise_if"]

RECOMPILE = "compile a new bundle on this machine with `dsgraph compile` (docs/bundle.md)"
# environment field -> what differs when it does
_ENV_WHAT = {
    "dsgraph": "dsgraph version",
    "commit": "dsgraph commit (graphs and kernels follow the source)",
    "source": "sha256 of dsgraph's Python sources (an uncommitted edit changes it)",
    "torch": "torch version",
    "triton": "Triton version (its kernel binaries)",
    "cuda": "CUDA version",
    "arch": "GPU architecture",
}
_FLAG = {
    "numerics": "--numerics",
    "platform": "--platform",
    "max_model_len": "--max-model-len",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "page_size": "page_size",
    "cache_budget_bytes": "cache_budget_bytes",
    "prefill_truncation": "--prefill-truncation",
    "speculative": "--speculative",
    "engine_type": "--engine-type",
    "deterministic": "--deterministic",
}


class BundleMismatchError(ValueError):
    """The bundle does not fit this run; `problems` lists every mismatch with what to do."""

    def __init__(self, root: Path | str, problems: list[str]) -> None:
        self.root, self.problems = Path(root), problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(
            f"bundle {root} cannot be used ({len(problems)} mismatches; nothing was rebuilt):\n{lines}"
        )


def raise_if(root: Path, problems: list[str]) -> None:
    if problems:
        raise BundleMismatchError(root, problems)


def check_environment(manifest: Mapping[str, Any], here: Mapping[str, Any]) -> list[str]:
    """The format and the build environment (versions, commit, architecture) against this process's."""
    problems = []
    if manifest.get("version") != VERSION:
        problems.append(
            f"format: the bundle is {FORMAT} v{manifest.get('version')}, this dsgraph reads v{VERSION}; "
            f"{RECOMPILE}"
        )
    if manifest.get("manifest_sha256") != manifest_checksum(dict(manifest)):
        problems.append(f"manifest: its checksum does not match its content (edited or damaged); {RECOMPILE}")
    built = manifest.get("environment", {})
    for field, what in _ENV_WHAT.items():
        if built.get(field) != here.get(field):
            problems.append(
                f"{field}: {what} is {built.get(field)!r} in the bundle, {here.get(field)!r} here; "
                f"run with the bundle's {field}, or {RECOMPILE}"
            )
    return problems


def check_files(root: Path, manifest: Mapping[str, Any]) -> list[str]:
    """Every file the manifest lists exists with its checksum; nothing unlisted sits in the graph folders."""
    problems = []
    files: Mapping[str, str] = manifest.get("files", {})
    for rel, digest in sorted(files.items()):
        path = root / rel
        if not path.is_file():
            problems.append(f"file {rel}: missing; {RECOMPILE}")
        elif sha256_file(path) != digest:
            problems.append(
                f"file {rel}: its sha256 differs from the manifest's (changed or damaged); {RECOMPILE}"
            )
    return problems


def check_run(manifest: Mapping[str, Any], fields: Mapping[str, Any], model_hash: str, ep: int) -> list[str]:
    """The run's configuration against the bundle's: model config, compiled fields, EP size, buckets."""
    problems = []
    if manifest.get("config_hash") != model_hash:
        problems.append(
            "model: this checkpoint's config.json differs from the one the bundle was compiled for "
            f"(sha256 {str(manifest.get('config_hash'))[:12]}.. vs {model_hash[:12]}..); pass the bundle's "
            f"--model {manifest.get('model_dir')}, or {RECOMPILE}"
        )
    built = manifest.get("engine", {})
    for name, value in fields.items():
        if built.get(name) != value:
            flag = _FLAG.get(name, name)
            problems.append(
                f"{name}: the bundle was compiled with {built.get(name)!r}, this run asks for {value!r}; "
                f"run with {flag} {built.get(name)!r}, or compile a bundle with {flag} {value!r}"
            )
    if manifest.get("ep", 1) != ep:
        problems.append(
            f"ep: the bundle is for an expert-parallel group of {manifest.get('ep', 1)} ranks, this run has "
            f"{ep} (another cluster shape); run with --ep {manifest.get('ep', 1)}, or compile with --ep {ep}"
        )
    return problems


def check_buckets(manifest: Mapping[str, Any], needed: Mapping[str, list[str]]) -> list[str]:
    """Every bucket the run can ask for is in the bundle."""
    have: Mapping[str, Any] = manifest.get("buckets", {})
    problems = []
    for kind, names in needed.items():
        missing = [n for n in names if n not in have.get(kind, {})]
        if missing:
            shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
            problems.append(f"buckets: the bundle has no {kind} bucket {shown}; {RECOMPILE}")
    return problems
