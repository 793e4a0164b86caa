"""Kernel variants are typed config fields bound into the cuda platform's rules, not module globals."""

from __future__ import annotations

from typing import Any

import pytest

from dsgraph.platform.cuda import target
from dsgraph.platform.cuda.kernel_config import ATTENTION_TILING, MOE_VARIANT, KernelConfig
from dsgraph.platform.cuda.kernels import attention, moe


def test_the_defaults_are_measured_variants_and_bad_names_are_refused() -> None:
    assert KernelConfig() == KernelConfig(ATTENTION_TILING, MOE_VARIANT)
    assert ATTENTION_TILING in attention.VARIANTS and MOE_VARIANT in moe.VARIANTS
    with pytest.raises(ValueError, match=r"moe_variant: 'fastest', expected one of \['base', "):
        KernelConfig(moe_variant="fastest")
    with pytest.raises(ValueError, match=r"attention_tiling: 'wide', expected one of"):
        KernelConfig(attention_tiling="wide")
    with pytest.raises(ValueError, match=r"moe_experts: variant 'x'"):
        moe.moe_experts(None, *[None] * 3, variant="x")


def test_no_module_global_selects_a_variant() -> None:
    assert not hasattr(attention, "VARIANT") and not hasattr(moe, "EXPERT_VARIANT")


def test_the_platform_binds_the_configs_variants() -> None:
    seen: list[dict[str, Any]] = []

    def fake(p: Any, *operands: Any, **kw: Any) -> None:
        seen.append(kw)

    rules = target.bound_rules(
        {"attention": fake, "moe_experts": fake, "rms_norm": fake}, KernelConfig("h16w4", "base")
    )
    for op in ("attention", "moe_experts", "rms_norm"):
        rules[op](None, 1, 2)
    assert seen == [{"tiling": "h16w4"}, {"variant": "base"}, {}]
    assert rules["attention"].__qualname__ == fake.__qualname__  # dumps name the rule, not the binding
    base = target.cuda_platform(KernelConfig(moe_variant="base"))
    assert base.rules["moe_experts"].__wrapped__ is target.KERNEL_RULES["moe_experts"]
    assert target.PLATFORM.rules["moe_experts"].__wrapped__ is moe.moe_experts
