"""Repository and package layout: nothing shadows the stdlib, subpackages ship, imports point one way.

The import-direction rules follow docs STYLE "Layout and imports": graph <- ops <- models;
graph/ops <- platform; models/platform <- runtime <- tools (arrow: imported by).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]
DEVICE_LIBS = ("torch", "numpy", "triton", "jax", "cupy")
UPPER_LAYERS = ("dsgraph.platform", "dsgraph.models", "dsgraph.runtime", "dsgraph.tools")
# Folder -> module prefixes its .py files must not import.
FORBIDDEN_IMPORTS: dict[str, tuple[str, ...]] = {
    "graph": (*DEVICE_LIBS, "dsgraph.ops", *UPPER_LAYERS),
    "ops": (*DEVICE_LIBS, *UPPER_LAYERS),
    "platform": ("dsgraph.runtime", "dsgraph.tools", "dsgraph.models"),
    "models": ("dsgraph.runtime", "dsgraph.tools"),
}


def run_from_repo_root(code: str) -> str:
    """Run `python -c code` with cwd = repo root (so '' on sys.path is the repo) and return stdout."""
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, f"python -c {code!r} from {REPO} failed:\n{result.stderr}"
    return result.stdout.strip()


def package_map() -> dict[str, str]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    return pyproject["tool"]["scikit-build"]["wheel"]["packages"]


def test_platform_from_repo_root_is_stdlib() -> None:
    found = Path(run_from_repo_root("import platform; print(platform.__file__)")).resolve()
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    assert found.parent == stdlib, f"`import platform` from the repo root gave {found}, expected {stdlib}"
    shadow = REPO / "platform" / "__init__.py"
    assert not shadow.exists(), f"{shadow} would make the repo's platform/ shadow the stdlib module"


def test_native_imports_from_repo_root() -> None:
    version = run_from_repo_root("import dsgraph.runtime._native as n; print(n.version())")
    assert version == importlib.metadata.version("dsgraph")


def test_packages_and_platform_subpackages_are_importable() -> None:
    platform_subpackages = sorted(p.parent.name for p in (REPO / "platform").glob("*/__init__.py"))
    assert platform_subpackages, "expected at least one platform subpackage (platform/<name>/__init__.py)"
    names = [key.replace("/", ".") for key in package_map()]
    names += [f"dsgraph.platform.{sub}" for sub in platform_subpackages]
    # find_spec imports parents only, so this checks shipping without running the subpackages' code.
    code = (
        "import importlib.util\n"
        f"for name in {names!r}:\n"
        "    spec = importlib.util.find_spec(name)\n"
        "    print(name, spec is not None and spec.submodule_search_locations is not None)\n"
    )
    found = dict(line.split() for line in run_from_repo_root(code).splitlines())
    assert found == {name: "True" for name in names}


def test_package_map_covers_python_folders() -> None:
    packages = dict(package_map())
    # the package's own __init__.py lives under api/, so nothing named dsgraph sits at the repo root
    assert packages.pop("dsgraph") == "api/dsgraph" and (REPO / "api/dsgraph/__init__.py").is_file()
    assert not (REPO / "dsgraph").exists() and not (REPO / "api/__init__.py").exists()
    mapped = set(packages.values())
    python_folders = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests"}
    missing = (python_folders | {"platform"}) - mapped
    assert not missing, f"folders not in tool.scikit-build.wheel.packages: {sorted(missing)}"
    assert all(key == f"dsgraph/{folder}" for key, folder in packages.items())


def test_top_level_names_import_from_the_repo_root() -> None:
    out = run_from_repo_root(
        "import dsgraph; from dsgraph import LLM, SamplingParams; print(dsgraph.__file__)"
    )
    assert Path(out).resolve() == (REPO / "api/dsgraph/__init__.py").resolve()


def test_no_top_level_name_shadows_stdlib() -> None:
    files = importlib.metadata.distribution("dsgraph").files or []
    installed = {f.parts[0].split(".")[0] for f in files if f.parts[0] != ".."}
    installed = {name for name in installed if not name.endswith("-info") and name.isidentifier()}
    assert "dsgraph" in installed, f"dsgraph not among the installed top-level names {sorted(installed)}"
    mapped = {key.split("/")[0] for key in package_map()}
    # With cwd = repo root, every importable top-level entry of the repo is on sys.path too.
    repo_modules = {p.parent.name for p in REPO.glob("*/__init__.py")} | {p.stem for p in REPO.glob("*.py")}
    for origin, names in (("installed", installed), ("package map", mapped), ("repo root", repo_modules)):
        shadowing = sorted(names & set(sys.stdlib_module_names))
        assert not shadowing, f"{origin} top-level names shadow stdlib modules: {shadowing}"


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("dsgraph", *parts))


def imported_names(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import, relative ones resolved against `module`."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            target = ".".join(part for part in (base, node.module or "") if part)
            found.append((node.lineno, target))
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Call) and _is_dynamic_import(node):
            found.append((node.lineno, node.args[0].value))  # type: ignore[attr-defined]
    return found


def _is_dynamic_import(node: ast.Call) -> bool:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    first = node.args[0] if node.args else None
    is_literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
    return name in ("import_module", "__import__") and is_literal


def import_violations(root: Path) -> list[str]:
    violations = []
    for folder, forbidden in FORBIDDEN_IMPORTS.items():
        for path in sorted((root / folder).rglob("*.py")):
            module = module_name(root, path)
            for line, name in imported_names(path.read_text(), module, path.name == "__init__.py"):
                if any(name == bad or name.startswith(f"{bad}.") for bad in forbidden):
                    violations.append(f"{path.relative_to(root)}:{line} imports {name} ({folder}/ must not)")
    return violations


def test_import_direction() -> None:
    assert import_violations(REPO) == []


def test_import_checker_catches_violations(tmp_path: Path) -> None:
    sources = {
        "graph/passes/__init__.py": "",
        "graph/passes/dce.py": "import numpy as np\nfrom ...ops import core\nfrom .. import ir\n",
        "graph/trace.py": "from dsgraph import runtime\nimport importlib\nimportlib.import_module('jax.nn')",
        "ops/core.py": "from dsgraph.graph import ir\nfrom ..platform.cpu import rules\n",
        "platform/cpu/rules.py": "import torch\nfrom dsgraph.ops import core\nfrom dsgraph.tools import cli",
        "models/m/__init__.py": "from . import c\nfrom dsgraph.platform import cpu\nfrom ...runtime import x",
    }
    for relative, text in sources.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    assert import_violations(tmp_path) == [
        "graph/passes/dce.py:1 imports numpy (graph/ must not)",
        "graph/passes/dce.py:2 imports dsgraph.ops (graph/ must not)",
        "graph/passes/dce.py:2 imports dsgraph.ops.core (graph/ must not)",
        "graph/trace.py:1 imports dsgraph.runtime (graph/ must not)",
        "graph/trace.py:3 imports jax.nn (graph/ must not)",
        "ops/core.py:2 imports dsgraph.platform.cpu (ops/ must not)",
        "ops/core.py:2 imports dsgraph.platform.cpu.rules (ops/ must not)",
        "platform/cpu/rules.py:3 imports dsgraph.tools (platform/ must not)",
        "platform/cpu/rules.py:3 imports dsgraph.tools.cli (platform/ must not)",
        "models/m/__init__.py:3 imports dsgraph.runtime (models/ must not)",
        "models/m/__init__.py:3 imports dsgraph.runtime.x (models/ must not)",
    ]


def test_gpu_marked_tests_skip_without_cuda() -> None:
    torch = pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("suite_conftest", REPO / "tests" / "conftest.py")
    assert spec is not None and spec.loader is not None
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    added: dict[str, list[pytest.MarkDecorator]] = {"gpu": [], "cpu": []}

    def item(name: str, marker: str | None) -> SimpleNamespace:
        return SimpleNamespace(
            get_closest_marker=lambda wanted: object() if wanted == marker else None,
            add_marker=added[name].append,
        )

    conftest.pytest_collection_modifyitems(None, [item("gpu", "gpu"), item("cpu", None)])
    skipped = [mark.name for mark in added["gpu"]]
    assert skipped == ([] if torch.cuda.is_available() else ["skip"])
    assert added["cpu"] == []
