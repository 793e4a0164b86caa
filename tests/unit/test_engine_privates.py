"""The engine's loops and helpers reach it through its public surface: no module under runtime/ other
than the engine's own (runtime/engine.py, runtime/spec_engine.py) reads, calls or replaces a private
member (`_name`) of an Engine or of its SpecDecoder. The overlap loops drive the runner and the engine's
step phases (`take_plan`, `begin_step`, `commit_step`, `commit_ahead`, `finish_step`, ...), so a change
inside the engine cannot silently break them.

An engine object is recognised by how the runtime names it: `engine` / `eng`, any `<x>.engine`, a name
assigned from one of those (`e = self.engine`), a parameter annotated `Engine`, and `.spec` of an engine
(its SpecDecoder)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGINE_MODULES = {Path("runtime/engine.py"), Path("runtime/spec_engine.py")}
ENGINE_NAMES = {"engine", "eng"}
ENGINE_TYPES = {"Engine", "SpecDecoder"}


def _annotated_engine(arg: ast.arg) -> bool:
    a = arg.annotation
    if isinstance(a, ast.Constant) and isinstance(a.value, str):
        return a.value in ENGINE_TYPES
    return isinstance(a, ast.Name) and a.id in ENGINE_TYPES


def _is_engine(node: ast.expr, names: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Attribute):
        return node.attr == "engine" or (node.attr == "spec" and _is_engine(node.value, names))
    return False


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of `scope` outside the functions nested in it (those are scopes of their own)."""
    out, todo = [], list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, FUNCTIONS):
            todo.extend(ast.iter_child_nodes(node))
    return out


def _engine_names(scope: ast.AST, outer: set[str]) -> set[str]:
    """The names bound to an engine object in `scope` (parameters, assignments from one), over `outer`."""
    names = set(outer)
    if isinstance(scope, FUNCTIONS):
        args = scope.args
        names |= {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if _annotated_engine(a)}
    nodes = _own_nodes(scope)
    changed = True
    while changed:  # aliases of aliases (`e = engine`, `f = e`)
        changed = False
        for node in nodes:
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if _is_engine(node.value, names):
                    new = {t.id for t in targets if isinstance(t, ast.Name)} - names
                    names |= new
                    changed = changed or bool(new)
    return names


def _scan(scope: ast.AST, outer: set[str], path: Path, found: set[tuple[int, str]]) -> None:
    names = _engine_names(scope, outer)
    for node in _own_nodes(scope):
        if isinstance(node, FUNCTIONS):
            _scan(node, names, path, found)
            continue
        private = isinstance(node, ast.Attribute) and node.attr.startswith("_")
        if private and not node.attr.startswith("__") and _is_engine(node.value, names):
            found.add((node.lineno, f"{path}:{node.lineno}: {ast.unparse(node)}"))


def violations(path: Path, text: str) -> list[str]:
    """`file:line: <expr>._name` for each access of an engine object's private member."""
    found: set[tuple[int, str]] = set()
    _scan(ast.parse(text), ENGINE_NAMES, path, found)
    return [v for _, v in sorted(found)]


def test_no_runtime_module_reaches_into_the_engine() -> None:
    files = sorted((REPO / "runtime").rglob("*.py"))
    assert len(files) > 20  # the scan sees the runtime package
    found = [
        v
        for p in files
        if p.relative_to(REPO) not in ENGINE_MODULES
        for v in violations(p.relative_to(REPO), p.read_text())
    ]
    assert not found, "a runtime module uses an engine's private member:\n" + "\n".join(found)


def test_the_scan_catches_each_form() -> None:
    """The checker itself: each way of reaching an engine's private member is reported (one per line),
    public members, the object's own privates and dunders are not."""
    bad = (
        "class Loop:\n"
        "    def step(self):\n"
        "        e = self.engine\n"
        "        plan = e._plan\n"  # 4: an alias of self.engine
        "        self.engine._skip(plan)\n"  # 5
        "def hook(engine):\n"
        "    engine._commit = None\n"  # 7: replaced
        "def g(x: Engine, y: 'SpecDecoder'):\n"
        "    return x._take(), y._trim\n"  # 9: annotated parameters
        "def h(loop):\n"
        "    f = loop.engine\n"
        "    k = f\n"
        "    return k.spec._pool, eng._fail\n"  # 13: alias of an alias, its SpecDecoder, `eng`
    )
    found = violations(Path("x.py"), bad)
    assert [v.split(":")[1] for v in found] == ["4", "5", "7", "9", "9", "13", "13"], found
    good = (
        "class Loop:\n"
        "    def step(self):\n"
        "        e = self.engine\n"
        "        return e.take_plan(), e.live, self._flight, engine.__class__\n"
        "def other(e):\n"
        "    return e._plan\n"  # `e` here is not bound to an engine
    )
    assert violations(Path("y.py"), good) == []
