"""Which kernel variant the cuda platform's rules run: a typed, validated config, bound into the rules
when the platform is built (`target.cuda_platform(config)`), never a module global flipped at run time.

The defaults are the variants the H200 measurements chose (the numbers are in bench/results and the
commit messages): for attention the "current" tiling (its prefill is faster than the smaller-head
tilings' decode gain), for the MoE experts "swap_ds" (swap-AB GEMMs, decode through tl.dot_scaled). A
variant only changes speed and, across variants, the last bits of a sum; within one variant a row's
result never depends on the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ATTENTION_TILING", "MOE_VARIANT", "KernelConfig"]

ATTENTION_TILING = "current"
MOE_VARIANT = "swap_ds"


@dataclass(frozen=True)
class KernelConfig:
    """`attention_tiling`: a name of kernels/attention.py VARIANTS; `moe_variant`: of kernels/moe.py's."""

    attention_tiling: str = ATTENTION_TILING
    moe_variant: str = MOE_VARIANT

    def __post_init__(self) -> None:
        from dsgraph.platform.cuda.kernels import attention, moe

        for name, value, allowed in (
            ("attention_tiling", self.attention_tiling, attention.VARIANTS),
            ("moe_variant", self.moe_variant, moe.VARIANTS),
        ):
            if value not in allowed:
                raise ValueError(f"{name}: {value!r}, expected one of {sorted(allowed)}")
