"""The platform owns execution: `runtime/` names no platform module beyond the platform layer's
interface (platform/registry.py, and the shared env/devices modules), and branches on no platform
(`on_device`). A platform's own code lives under platform/<name>/ and is reached through the registry."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ALLOWED = {
    "dsgraph.platform",
    "dsgraph.platform.registry",
    "dsgraph.platform.env",
    "dsgraph.platform.devices",
}
# a platform's module named in source text (an importlib string, a lazy import) or a platform branch
FORBIDDEN_TEXT = re.compile(r"platform\.(cpu|cuda|null)\b|\bon_device\b")


def violations(path: Path, text: str) -> list[str]:
    """`file:line: what` for each line importing a platform module outside ALLOWED or naming a platform
    module or `on_device` (one entry per line, in line order)."""
    found: dict[int, str] = {}
    for node in ast.walk(ast.parse(text)):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module] + (
                [f"{node.module}.{a.name}" for a in node.names] if node.module == "dsgraph.platform" else []
            )
        for m in modules:
            if m.startswith("dsgraph.platform") and m not in ALLOWED:
                found.setdefault(node.lineno, f"{path}:{node.lineno}: imports {m}")
    for i, line in enumerate(text.splitlines(), 1):
        hit = FORBIDDEN_TEXT.search(line)
        if hit:
            found.setdefault(i, f"{path}:{i}: names {hit.group(0)}")
    return [found[i] for i in sorted(found)]


def test_runtime_names_no_platform_module() -> None:
    files = sorted((REPO / "runtime").rglob("*.py"))
    assert len(files) > 20  # the scan sees the runtime package
    found = [v for p in files for v in violations(p.relative_to(REPO), p.read_text())]
    assert not found, "runtime/ reaches past the platform registry:\n" + "\n".join(found)


def test_the_scan_catches_each_form() -> None:
    """The checker itself: every way of naming a platform is reported, the interface is not."""
    bad = (
        "from dsgraph.platform.cuda.execute import DeviceProgram\n"
        "import dsgraph.platform.cpu.interpret\n"
        "from dsgraph.platform import cuda\n"
        "def f(s):\n"
        "    from dsgraph.platform.cpu import runner\n"
        "    return s.on_device\n"
        "m = 'dsgraph.platform.null.target'\n"
    )
    found = violations(Path("x.py"), bad)
    assert [v.split(":")[1] for v in found] == ["1", "2", "3", "5", "6", "7"], found
    good = "from dsgraph.platform.registry import make_runner\nfrom dsgraph.platform import env\n"
    assert violations(Path("y.py"), good) == []
