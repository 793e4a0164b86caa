"""Nothing in `runtime/` names a model: its Python sources import `dsgraph.models.interface` and
`dsgraph.models.registry` only, so a second model plugs in through the registry alone."""

from __future__ import annotations

import ast
from pathlib import Path

import dsgraph.runtime

ALLOWED = {"dsgraph.models", "dsgraph.models.interface", "dsgraph.models.registry"}


def _model_imports(path: Path) -> list[str]:
    """Every `dsgraph.models...` module a source imports (top level or inside a function)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "dsgraph.models":  # `from dsgraph.models import deepseek_v41`
                found += [f"dsgraph.models.{a.name}" for a in node.names]
            else:
                found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return [m for m in found if m.startswith("dsgraph.models") and m not in ALLOWED]


def test_runtime_imports_no_model_package() -> None:
    root = Path(dsgraph.runtime.__file__).parent
    sources = sorted(root.rglob("*.py"))
    assert len(sources) > 30  # the scan sees the whole runtime package
    bad = {str(p.relative_to(root)): m for p in sources if (m := _model_imports(p))}
    assert bad == {}, f"runtime/ modules import a model package: {bad}"


def test_scan_catches_a_model_import(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    src.write_text(
        "from dsgraph.models.interface import ratios\n"
        "def f():\n    from dsgraph.models.deepseek_v4.model import build_model\n"
        "from dsgraph.models import deepseek_v41\nimport dsgraph.models.deepseek_v41.tiny\n"
    )
    assert sorted(_model_imports(src)) == [
        "dsgraph.models.deepseek_v4.model",
        "dsgraph.models.deepseek_v41",
        "dsgraph.models.deepseek_v41.tiny",
    ]
