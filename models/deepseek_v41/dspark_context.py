"""The DSpark context the target step writes for the drafter (spec model-v41 7.1; deepinfer-parity 5.1, 7a).

For every row of a target step (prefill chunks, decode and verify rows alike, as DeepInfer does inside
its main forward): the residual streams entering each `dspark_target_layer_ids` layer (after its Engram,
before its attention mHC) are averaged over the streams in f32, concatenated, and projected once,
`main_x = main_norm(main_proj(features))`; then each stage s stores the context key
`fp8_g32(rope(kv_norm_s(wkv_s main_x)))` at the row's position in its own ring `dspark.ring{s}`, which has
the byte format and length of the `swa.*` rings. Rows of rejected drafts are overwritten by the next
verify step before any draft reads them (the draft reads positions strictly before its anchor).
"""

from __future__ import annotations

from dsgraph.graph.types import TensorType
from dsgraph.models.deepseek_v41.config import TextConfig
from dsgraph.models.deepseek_v41.context import Forward, Tracer
from dsgraph.models.deepseek_v41.layers_plan import draft_plans
from dsgraph.ops import op
from dsgraph.platform.cpu.cache_format import fp8_g32_entry_bytes

__all__ = [
    "context_key",
    "is_context_weight",
    "is_draft_weight",
    "ring_name",
    "ring_types",
    "stream_mean",
    "write_context",
]

# Target-side DSpark weights: only stage 0 has main_proj/main_norm; every stage's wkv/kv_norm makes keys.
_CONTEXT_ONLY = ("main_proj.", "main_norm.")
_CONTEXT_SHARED = ("attn.wkv.", "attn.kv_norm.")


def ring_name(stage: int) -> str:
    return f"dspark.ring{stage}"


def ring_types(text: TextConfig, ring_len: int) -> dict[str, TensorType]:
    """The context rings `dspark.ring{s}` [slots, ring_len, fp8_g32 entry bytes] u8, one per stage."""
    entry = fp8_g32_entry_bytes(text.head_dim)
    return {
        ring_name(s): TensorType(("slots", ring_len, entry), "u8")
        for s in range(text.num_nextn_predict_layers)
    }


def _stage_part(name: str) -> str | None:
    """`mtp.{s}.<rest>` -> `<rest>`; None for a tensor outside the draft stages."""
    if not name.startswith("mtp."):
        return None
    return name.split(".", 2)[2] if name.count(".") >= 2 else None


def is_context_weight(name: str) -> bool:
    """Whether the target step reads weight `name` when it writes the DSpark context."""
    rest = _stage_part(name)
    return rest is not None and rest.startswith(_CONTEXT_ONLY + _CONTEXT_SHARED)


def is_draft_weight(name: str) -> bool:
    """Whether the draft graph reads weight `name`: the shared embedding and head, and `mtp.*` less
    main_proj/main_norm (those run in the target step)."""
    if name in ("embed.weight", "head.weight"):
        return True
    rest = _stage_part(name)
    return rest is not None and not rest.startswith(_CONTEXT_ONLY)


def stream_mean(f: Forward, x: Tracer) -> Tracer:
    """[T, n, H] streams -> [T, H]: their mean in f32, stored in the activation dtype (DeepInfer 7a)."""
    return f.cast(op.reduce_mean(f.cast(x, "f32"), axes=(1,)), f.num.act_dtype)


def context_key(f: Forward, stage: int, x: Tracer, positions: Tracer) -> Tracer:
    """Stage `stage`'s key of rows x [T, H] at `positions`, before its FP8 rounding: rope(kv_norm(wkv x)).

    The same projection makes the target's context keys (x = main_x) and the draft block's own keys."""
    p = f"mtp.{stage}.attn."
    plan = draft_plans(f.text)[stage]
    # serving: wkv output, kv_norm output and RoPE output in BF16, as on the backbone's SWA path (1a, 1b)
    kv = f.norm(f.linear(x, p + "wkv.weight"), p + "kv_norm.weight")
    return f.rope(kv, positions, plan.rope_theta, plan.use_yarn)


def write_context(f: Forward, features: list[Tracer]) -> None:
    """Write every row's context key into each stage's ring; `features` [T, H] per target layer."""
    s = f.step
    joined = op.concat(*features, axis=1)  # [T, len(target layers) * H]
    f.record("dspark.features", joined)
    # serving: FP8 main_proj input, BF16 main_proj and main_norm outputs (numerics 2d, 1a)
    main_x = f.norm(f.linear(joined, "mtp.0.main_proj.weight"), "mtp.0.main_norm.weight")
    for stage in range(f.text.num_nextn_predict_layers):
        kv = context_key(f, stage, main_x, s["positions"])
        f.record(f"dspark.kv{stage}", kv)
        name = ring_name(stage)
        entries = op.cache_encode(op.act_qdq(kv, fmt="fp8_g32"), fmt="fp8_g32")  # as the swa.* rings
        f.new_caches[name] = op.swa_write(
            f.caches[name], entries, s["positions"], s["seq_ids"], s["seq_slot"], s["seq_end"]
        )
