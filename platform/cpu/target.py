"""The cpu platform: the executable specification of every op."""

from __future__ import annotations

import dsgraph.ops  # noqa: F401  (declares the ops)
from dsgraph.platform.cpu.rules_attention import RULES as ATTENTION_RULES
from dsgraph.platform.cpu.rules_cache import RULES as CACHE_RULES
from dsgraph.platform.cpu.rules_core import RULES as CORE_RULES
from dsgraph.platform.cpu.rules_dspark import RULES as DSPARK_RULES
from dsgraph.platform.cpu.rules_engram import RULES as ENGRAM_RULES
from dsgraph.platform.cpu.rules_fused import RULES as FUSED_RULES
from dsgraph.platform.cpu.rules_mhc import RULES as MHC_RULES
from dsgraph.platform.cpu.rules_moe import RULES as MOE_RULES
from dsgraph.platform.cpu.rules_mtp import RULES as MTP_RULES
from dsgraph.platform.cpu.rules_quant import RULES as QUANT_RULES
from dsgraph.platform.cpu.rules_rope import RULES as ROPE_RULES
from dsgraph.platform.cpu.rules_sampling import RULES as SAMPLING_RULES
from dsgraph.platform.cpu.rules_spec import RULES as SPEC_RULES
from dsgraph.platform.cpu.rules_window import RULES as WINDOW_RULES
from dsgraph.platform.registry import Platform

PLATFORM = Platform(
    "cpu",
    {
        **CORE_RULES,
        **QUANT_RULES,
        **ROPE_RULES,
        **MHC_RULES,
        **MOE_RULES,
        **ENGRAM_RULES,
        **ATTENTION_RULES,
        **CACHE_RULES,
        **SAMPLING_RULES,
        **DSPARK_RULES,
        **SPEC_RULES,
        **WINDOW_RULES,
        **MTP_RULES,
        **FUSED_RULES,
    },
)
