"""Checkpoint tensors -> the step graph's weight inputs for a numerics mode.

Routed experts are stacked per layer (`layers.{i}.ffn.experts.w1.weight` [E, I, H]), as for V4.1.
`reference` dequantizes FP8/FP4 weights to f32. `serving` keeps them stored; the release's 128 x 128 FP8
block scales are repeated to the 32 x 32 blocks the `linear` op reads (the same values, exactly). A
hash-routed layer's `ffn.gate.tid2eid` becomes `ffn.gate.hash_bias` [V, E] f32: HASH_BIAS on the experts
a token id routes to, 0 elsewhere; `moe_route` then selects exactly those, and the weights come from the
router's scores as in the reference.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from dsgraph.models.deepseek_v4.checkpoint_spec import expected_tensors
from dsgraph.models.deepseek_v4.config import V4Config
from dsgraph.models.deepseek_v41.checkpoint_spec import TensorKind, TensorSpec, scale_name
from dsgraph.models.deepseek_v41.numerics import Numerics
from dsgraph.models.deepseek_v41.weights import _stack_experts
from dsgraph.platform.cpu.quant import fp4_rows_dequantize, fp8_block_dequantize

__all__ = ["HASH_BIAS", "prepare_weights"]

HASH_BIAS = 1e30  # larger than any router score: the hashed experts win the top-k, whatever the scores


def _hash_bias(name: str, tid2eid: Tensor, num_experts: int) -> Tensor:
    ids = tid2eid.long()
    if ids.is_meta:  # shapes only (dsgraph inspect traces with meta weights): no ids to check
        return torch.empty(ids.shape[0], num_experts, dtype=torch.float32, device="meta")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_experts):
        raise ValueError(
            f"tensor {name}: expert ids must be in [0, {num_experts}), "
            f"found {int(ids.min())}..{int(ids.max())}"
        )
    bias = torch.zeros(ids.shape[0], num_experts, dtype=torch.float32)
    bias.scatter_(1, ids, HASH_BIAS)
    repeated = (bias > 0).sum(dim=1) != ids.shape[1]
    if bool(repeated.any()):
        row = int(repeated.nonzero()[0, 0])
        raise ValueError(f"tensor {name}: token {row} routes to a repeated expert {ids[row].tolist()}")
    return bias


def _stored_fp8(t: Tensor, scale: Tensor, block: tuple[int, int]) -> Tensor:
    """A block scale of `block` repeated to 32 x 32 blocks (block dims are multiples of 32)."""
    rows, cols = t.shape
    s = scale.repeat_interleave(block[0] // 32, dim=0).repeat_interleave(block[1] // 32, dim=1)
    return s[: -(-rows // 32), : -(-cols // 32)].contiguous()


def prepare_weights(
    cfg: V4Config,
    stored: Mapping[str, Tensor],
    num: Numerics,
    specs: Mapping[str, TensorSpec] | None = None,
) -> dict[str, Tensor]:
    """`stored` is the loader's "stored" output; returns the graph's weight inputs by name. `specs`: the
    tensors to convert (default: the backbone's, `expected_tensors`; the MTP layer's: `mtp.mtp_tensors`)."""
    block = cfg.quant.weight_block_size if cfg.quant is not None else (32, 32)
    specs = expected_tensors(cfg) if specs is None else specs
    out: dict[str, Tensor] = {}
    for name, spec in specs.items():
        t = stored[name]
        if spec.kind is TensorKind.SCALE:
            weight = name.removesuffix(".scale") + ".weight"
            if num.stored_weights and specs[weight].kind is TensorKind.FP8_BLOCK:
                out[name] = _stored_fp8(stored[weight], t, block)
            elif num.stored_weights:
                out[name] = t
        elif name.endswith("ffn.gate.tid2eid"):
            out[name.replace("tid2eid", "hash_bias")] = _hash_bias(name, t, cfg.text.n_routed_experts)
        elif num.stored_weights or spec.kind is TensorKind.PLAIN:
            out[name] = t if num.stored_weights or not t.is_floating_point() else t.float()
        elif spec.kind is TensorKind.FP8_BLOCK:
            out[name] = fp8_block_dequantize(t, stored[scale_name(name)], torch.float32, block=block)
        else:
            out[name] = fp4_rows_dequantize(t, stored[scale_name(name)], torch.float32)
    return _stack_experts(out)
