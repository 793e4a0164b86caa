"""Every kernel module of the cuda platform imports, and the platform takes every rule they declare.

Where a kernel module fails to import, the cuda platform quietly runs the cpu rule for its ops (the
lowering notes it as a fallback); these tests make that a failure wherever triton is installed. Triton
is a test dependency on linux x86_64 (pyproject's `test` extra), so there these tests always run; on
other machines (where no triton wheel exists) they are skipped, and a skip is not a pass.
"""

from __future__ import annotations

import importlib
import importlib.util
import platform
import sys
from pathlib import Path

import pytest

from tests.cuda.kernel_env import compare_rules

KERNELS = Path(__file__).resolve().parents[2] / "platform" / "cuda" / "kernels"
MODULES = sorted(p.stem for p in KERNELS.glob("*.py") if p.stem != "__init__")
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed on this machine")


def test_the_kernel_modules_are_found() -> None:
    # the parametrized import test below must not pass over an empty list
    assert {"attention", "attention_tl", "moe", "moe_tl", "linear", "linear_tl"} <= set(MODULES), MODULES


def test_triton_is_installed_where_the_test_extra_installs_it() -> None:
    if sys.platform == "linux" and platform.machine() == "x86_64":
        assert HAS_TRITON, "triton is missing: it is in pyproject's `test` extra on linux x86_64"
    else:
        pytest.skip(f"no triton wheel for {sys.platform} {platform.machine()}")


@needs_triton
@pytest.mark.parametrize("name", MODULES)
def test_kernel_module_imports(name: str) -> None:
    importlib.import_module(f"dsgraph.platform.cuda.kernels.{name}")


@needs_triton
def test_the_cuda_platform_runs_every_declared_kernel_rule() -> None:
    from dsgraph.platform.cuda import target

    assert target.IMPORT_ERRORS == {} and target.FALLBACKS == {} and dict(target.PLATFORM.fallbacks) == {}
    for name in MODULES:
        declared = target._declared_ops(KERNELS / f"{name}.py")
        for op in declared:
            assert target.PLATFORM.rules[op] is target.KERNEL_RULES[op], f"kernels.{name}: {op}"
    assert len(target.KERNEL_RULES) >= 20, sorted(target.KERNEL_RULES)


def test_a_kernel_comparison_without_a_kernel_rule_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """compare_rules never falls back to comparing the cpu rule with itself."""
    import torch

    from dsgraph.platform.cuda import target

    monkeypatch.setattr(target, "KERNEL_RULES", {})
    monkeypatch.setattr(target, "IMPORT_ERRORS", {"norm_rope": "ImportError: no triton"})

    class Eps:
        eps = 1e-6

    with pytest.raises(
        AssertionError, match=r"rms_norm: no kernel rule to test .*kernels.norm_rope: ImportError"
    ):
        compare_rules("rms_norm", Eps(), [torch.ones(2, 8), torch.ones(8)])


RULE_MODULES = [m for m in MODULES if not m.endswith("_tl")]


@needs_triton
@pytest.mark.parametrize("name", RULE_MODULES)
def test_each_rule_names_the_kernels_it_launches(name: str) -> None:
    """KERNELS (what `dsgraph inspect --platform cuda` prints) covers the module's rules, and every name
    in it is a Triton kernel of the folder."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    module = importlib.import_module(f"dsgraph.platform.cuda.kernels.{name}")
    assert set(module.KERNELS) == set(module.RULES), f"kernels.{name}: KERNELS and RULES name other ops"
    for op, launches in module.KERNELS.items():
        for qualified in launches:
            owner, kernel = qualified.split(".")
            fn = getattr(importlib.import_module(f"dsgraph.platform.cuda.kernels.{owner}"), kernel)
            assert isinstance(fn, JITFunction | InterpretedFunction), f"kernels.{name} {op}: {qualified}"


@needs_triton
def test_every_launched_kernel_is_named_by_a_rule() -> None:
    """A launch site `K.name_kernel[grid](...)` anywhere in the folder is listed in some KERNELS table."""
    import re

    named = {
        q.split(".")[1]
        for m in RULE_MODULES
        for launches in importlib.import_module(f"dsgraph.platform.cuda.kernels.{m}").KERNELS.values()
        for q in launches
    }
    launched = {k for m in MODULES for k in re.findall(r"(\w+_kernel)\[", (KERNELS / f"{m}.py").read_text())}
    assert launched and launched <= named, sorted(launched - named)
