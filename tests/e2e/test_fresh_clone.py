"""The README's first two commands on a fresh clone: `bin/dsgraph generate` (the main job on the embedded
model) and `bin/test` (what .ci/run runs). The fast test reuses this suite's environment
(DSGRAPH_VENV); the slow one lets them create the clone's own environment, as on a new machine
(dsgraph's caches empty; pip's wheel cache kept: what .ci/setup downloaded is not downloaded again)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def _clone(tmp_path: Path) -> Path:
    if subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout: nothing to clone")
    dest = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(dest)], check=True)
    return dest


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _pip_cache() -> str:
    """This machine's pip cache (where .ci/setup left the wheels it downloaded)."""
    home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return os.environ.get("PIP_CACHE_DIR") or str(Path(home) / "pip")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    # dsgraph's own caches start empty; pip keeps its wheel cache, so the new environment is still
    # created and installed from scratch but does not download again what this machine already has
    env = {k: v for k, v in os.environ.items() if k != "DSGRAPH_VENV"}
    return env | {"XDG_CACHE_HOME": str(tmp_path / "cache"), "PIP_CACHE_DIR": _pip_cache(), **extra}


def test_the_readme_starts_with_the_two_commands() -> None:
    blocks = README.split("```sh\n")
    assert blocks[1].splitlines()[:2] == ['bin/dsgraph generate --prompt "w1 W2 w3"', "bin/test"]


def test_both_commands_run_from_a_clone(tmp_path: Path) -> None:
    clone = _clone(tmp_path)
    env = _env(tmp_path, DSGRAPH_VENV=sys.prefix)
    gen = _run(["bin/dsgraph", "generate", "--max-tokens", "3"], clone, env, 300)
    assert gen.returncode == 0 and "tokens generated" in gen.stdout, gen.stderr
    tests = _run(["bin/test", "tests/unit/test_sampling_params.py"], clone, env, 300)
    assert tests.returncode == 0 and " passed" in tests.stdout, tests.stdout + tests.stderr


@pytest.mark.slow
def test_first_use_creates_the_environment(tmp_path: Path) -> None:
    clone = _clone(tmp_path)
    env = _env(tmp_path)
    tests = _run(["bin/test", "tests/unit/test_sampling_params.py"], clone, env, 900)
    assert tests.returncode == 0 and " passed" in tests.stdout, tests.stdout[-2000:] + tests.stderr[-4000:]
    assert "first use: creating the environment" in tests.stderr and (clone / ".venv/bin/dsgraph").exists()
    gen = _run(["bin/dsgraph", "generate", "--max-tokens", "3"], clone, env, 300)
    assert gen.returncode == 0 and "tokens generated" in gen.stdout, gen.stderr
    assert "first use" not in gen.stderr  # created once
