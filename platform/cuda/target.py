"""The cuda platform's rule table: every cpu rule (device-agnostic torch) by default, the cache writes in
their in-place form, then the `RULES` of every `dsgraph.platform.cuda.kernels.*` module over them.

A kernel module that fails to import (no triton, no GPU toolchain) is skipped: its ops keep the cpu rule,
and `FALLBACKS` (shown by `Program.as_text` and `dsgraph inspect`) says which ops and why. The tests do
not accept that: tests/cuda/test_kernel_imports.py fails when any kernel module does not import where
triton is installed, and the kernel tests refuse to compare an op that has no kernel rule.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dsgraph.ops  # noqa: F401  (declares the ops)
from dsgraph.graph.ir import Eqn
from dsgraph.platform.cpu.rules_cache import INPLACE_RULES as CACHE_INPLACE
from dsgraph.platform.cpu.rules_fused import INPLACE_RULES as FUSED_INPLACE
from dsgraph.platform.cpu.rules_window import INPLACE_RULES as WINDOW_INPLACE
from dsgraph.platform.cpu.target import PLATFORM as CPU
from dsgraph.platform.registry import Platform, Rule

KERNELS_PACKAGE = "dsgraph.platform.cuda.kernels"


def _compress_state(eqn: Eqn) -> tuple[tuple[int, int], ...]:
    """compress of ratio 2 overwrites its state operand (3) with output 2; ratio 1 has no state."""
    return ((3, 2),) if eqn.params.ratio == 2 else ()


# op -> the (operand, output) pairs its cuda rule writes in place (the rule returns the operand itself)
INPLACE: dict[str, Any] = {
    "swa_write": lambda _eqn: ((0, 0),),
    "paged_write": lambda _eqn: ((0, 0),),
    "encode_swa_write": lambda _eqn: ((0, 0),),
    "encode_paged_write": lambda _eqn: ((0, 0),),
    "compress": _compress_state,
    "compress_norm": _compress_state,
    "window_compress": lambda _eqn: ((4, 2),),
}
INPLACE_RULES = {**CACHE_INPLACE, **WINDOW_INPLACE, **FUSED_INPLACE}


def _declared_ops(path: Path) -> list[str]:
    """Op names of a module's literal `RULES = {...}` (read from source: the module failed to import)."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return []
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == "RULES" and isinstance(node.value, ast.Dict):
            return [
                k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
            ]
    return []


def kernel_rules(
    package_name: str = KERNELS_PACKAGE,
) -> tuple[dict[str, Rule], dict[str, str], dict[str, str]]:
    """(op -> kernel rule, op -> fallback reason, kernel module -> import error) over the modules of
    `package_name` (`kernels/*.py`)."""
    rules: dict[str, Rule] = {}
    fallbacks: dict[str, str] = {}
    errors: dict[str, str] = {}
    try:
        package = importlib.import_module(package_name)
    except ImportError as exc:
        return rules, fallbacks, {package_name: f"{type(exc).__name__}: {exc}"}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        name = f"{package_name}.{info.name}"
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001  (any import failure of a kernel module means: fall back)
            errors[info.name] = f"{type(exc).__name__}: {exc}"
            origin = Path(package.__path__[0]) / f"{info.name}.py"
            for op in _declared_ops(origin):
                fallbacks[op] = f"kernels.{info.name} did not import ({errors[info.name]}); the cpu rule runs"
            continue
        rules.update(getattr(module, "RULES", {}))
    return rules, fallbacks, errors


def kernel_launches(rules: Mapping[str, Rule]) -> dict[str, tuple[str, ...]]:
    """op -> the Triton kernels its kernel rule may launch: the `KERNELS` table of the rule's module."""
    return {
        op: tuple(getattr(sys.modules[r.__module__], "KERNELS", {}).get(op, ())) for op, r in rules.items()
    }


def cuda_platform() -> Platform:
    """The cuda platform: the cpu rules, the in-place cache writes, then every kernel rule over them."""
    return Platform(
        "cuda",
        {**CPU.rules, **INPLACE_RULES, **KERNEL_RULES},
        unsupported=CPU.unsupported,
        fallbacks={op: why for op, why in FALLBACKS.items() if op not in KERNEL_RULES},
        inplace=INPLACE,
        kernels=kernel_launches(KERNEL_RULES),
        fuse=True,
    )


KERNEL_RULES, FALLBACKS, IMPORT_ERRORS = kernel_rules()
PLATFORM = cuda_platform()
# the platform without kernel modules: what the cuda platform runs where no kernel applies (tests)
DEFAULTS = Platform("cuda", {**CPU.rules, **INPLACE_RULES}, unsupported=CPU.unsupported, inplace=INPLACE)
