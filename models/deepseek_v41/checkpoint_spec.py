"""The tensors of a released V4.1 checkpoint: name -> shape, dtype, kind (spec model-v41 section 8).

Names follow the released layout that NeMo's `DeepseekV41StateDictAdapter.from_hf` and
`DeepseekV41DSparkStateDictAdapter.from_hf` consume. Dtypes are safetensors names. The choices:
- F32: `hc_*_{fn,base,scale}`, `attn.attn_sink`, `ffn.gate.bias`, `ffn.gate.bias_vl` (DeepInfer enforces
  FP32), and `head.weight`, `attn.compressor.{wkv,wgate}.weight` (NeMo keeps them FP32; DeepInfer's
  loader implies BF16 in the release, numerics section 9, so BF16 is also accepted for these three);
- BF16: every norm weight, `embed.weight`, `attn.indexer.{wk,weights_proj}.weight`, `engram.{q,k}_weight`,
  `ffn.gate.weight`, `markov_head.*`, `confidence_head.proj.weight` (F32 also accepted: spec 7.1 says F32);
- F8_E4M3 + F8_E8M0 block scales: the dense projections (`attn.wq_a/wq_b/wkv/wo_a/wo_b`,
  `attn.indexer.wq_b`, `ffn.shared_experts.w1/w2/w3`, `engram.wkv`, `mtp.0.main_proj`);
- I8 (packed E2M1) + F8_E8M0 row scales: routed experts (F8_E4M3 blocks when `expert_dtype` is fp8);
- F8_E4M3 + F8_E8M0 row scales: `engram.embed.weight`.
Without a `quantization_config` every quantized weight is a plain BF16 matrix. Vision tensors
(`vision.*`, `aligner.*`, `image_*`) are not part of this table; the loader skips them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from dsgraph.models.deepseek_v41.config import ModelConfig, TextConfig
from dsgraph.models.deepseek_v41.layers_plan import LayerMode, LayerPlan, layer_plans

__all__ = ["TensorKind", "TensorSpec", "expected_tensors", "is_vision_tensor", "scale_name"]

_VISION_PREFIXES = ("vision.", "aligner.")
_VISION_NAMES = ("image_start", "image_end", "image_newline")


class TensorKind(enum.Enum):
    PLAIN = "plain"  # stored as is
    FP8_BLOCK = "fp8_block"  # E4M3 weight, UE8M0 scale per weight block in `<base>.scale`
    FP4_ROWS = "fp4_rows"  # packed E2M1 int8 weight, UE8M0 scale per 32 columns of each row
    FP8_ROWS = "fp8_rows"  # E4M3 weight, UE8M0 scale per 32 columns of each row
    SCALE = "scale"  # the UE8M0 companion of a quantized weight


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One stored tensor. `logical_shape` is the dequantized matrix shape (= shape for PLAIN)."""

    shape: tuple[int, ...]
    dtype: str
    kind: TensorKind
    logical_shape: tuple[int, ...]
    also_dtypes: tuple[str, ...] = ()

    def accepts_dtype(self, dtype: str) -> bool:
        return dtype == self.dtype or dtype in self.also_dtypes

    def dtype_text(self) -> str:
        return "|".join((self.dtype, *self.also_dtypes))


def scale_name(weight_name: str) -> str:
    """`x.weight` -> `x.scale`."""
    return weight_name.removesuffix(".weight") + ".scale"


def is_vision_tensor(name: str) -> bool:
    return name.startswith(_VISION_PREFIXES) or name in _VISION_NAMES


def expected_tensors(cfg: ModelConfig) -> dict[str, TensorSpec]:
    """Every text and DSpark tensor of the released layout, in a stable order."""
    t = cfg.text
    b = _Builder(cfg)
    b.plain("embed.weight", (t.vocab_size, t.hidden_size), "BF16")
    for plan in layer_plans(t):
        _backbone_layer(b, t, plan)
    b.plain("norm.weight", (t.hidden_size,), "BF16")
    b.plain("head.weight", (t.vocab_size, t.hidden_size), "F32", also=("BF16",))
    for k in range(t.num_nextn_predict_layers):
        _dspark_stage(b, t, k)
    return b.out


class _Builder:
    """Collects specs; `matrix` expands a quantizable weight into weight (+ scale) per the quant config."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.quant = cfg.quant
        self.out: dict[str, TensorSpec] = {}

    def plain(self, name: str, shape: tuple[int, ...], dtype: str, also: tuple[str, ...] = ()) -> None:
        self.out[name] = TensorSpec(shape, dtype, TensorKind.PLAIN, shape, also)

    def matrix(self, name: str, rows: int, cols: int, kind: TensorKind) -> None:
        if self.quant is None:
            self.plain(name, (rows, cols), "BF16")
            return
        if kind is TensorKind.FP4_ROWS and self.quant.expert_dtype == "fp8":
            kind = TensorKind.FP8_BLOCK
        br, bc = self.quant.weight_block_size
        shapes = {
            TensorKind.FP8_BLOCK: ((rows, cols), "F8_E4M3", (-(-rows // br), -(-cols // bc))),
            TensorKind.FP4_ROWS: ((rows, cols // 2), "I8", (rows, cols // 32)),
            TensorKind.FP8_ROWS: ((rows, cols), "F8_E4M3", (rows, cols // 32)),
        }
        shape, dtype, scale_shape = shapes[kind]
        self.out[name] = TensorSpec(shape, dtype, kind, (rows, cols))
        self.out[scale_name(name)] = TensorSpec(scale_shape, "F8_E8M0", TensorKind.SCALE, scale_shape)


def _backbone_layer(b: _Builder, t: TextConfig, plan: LayerPlan) -> None:
    p = f"layers.{plan.index}."
    if plan.engram_table >= 0:
        _engram(b, t, p, t.engram_num_embeddings[plan.engram_table])
    b.plain(p + "attn_norm.weight", (t.hidden_size,), "BF16")
    _attention(b, t, p)
    if plan.mode is LayerMode.FULL:
        _compressor(b, t, p, plan.ratio)
    if plan.mode in (LayerMode.FULL, LayerMode.REINDEX):
        _indexer(b, t, p, owns_keys=plan.mode is LayerMode.FULL)
    b.plain(p + "ffn_norm.weight", (t.hidden_size,), "BF16")
    _ffn(b, t, p, t.n_routed_experts)
    _hyper_connections(b, t, p)


def _attention(b: _Builder, t: TextConfig, p: str) -> None:
    h, hd, heads, groups = t.hidden_size, t.head_dim, t.num_attention_heads, t.o_groups
    b.matrix(p + "attn.wq_a.weight", t.q_lora_rank, h, TensorKind.FP8_BLOCK)
    b.plain(p + "attn.q_norm.weight", (t.q_lora_rank,), "BF16")
    b.matrix(p + "attn.wq_b.weight", heads * hd, t.q_lora_rank, TensorKind.FP8_BLOCK)
    b.matrix(p + "attn.wkv.weight", hd, h, TensorKind.FP8_BLOCK)
    b.plain(p + "attn.kv_norm.weight", (hd,), "BF16")
    b.matrix(p + "attn.wo_a.weight", groups * t.o_lora_rank, heads * hd // groups, TensorKind.FP8_BLOCK)
    b.matrix(p + "attn.wo_b.weight", h, groups * t.o_lora_rank, TensorKind.FP8_BLOCK)
    b.plain(p + "attn.attn_sink", (heads,), "F32")


def _compressor(b: _Builder, t: TextConfig, p: str, ratio: int) -> None:
    b.plain(p + "attn.compressor.wkv.weight", (t.head_dim, t.hidden_size), "F32", also=("BF16",))
    if ratio > 1:  # ratio 1 is a plain projection: no pooling gate
        b.plain(p + "attn.compressor.wgate.weight", (t.head_dim, t.hidden_size), "F32", also=("BF16",))
    b.plain(p + "attn.compressor.norm.weight", (t.head_dim,), "BF16")


def _indexer(b: _Builder, t: TextConfig, p: str, owns_keys: bool) -> None:
    b.matrix(
        p + "attn.indexer.wq_b.weight",
        t.index_n_heads * t.index_head_dim,
        t.q_lora_rank,
        TensorKind.FP8_BLOCK,
    )
    b.plain(p + "attn.indexer.weights_proj.weight", (t.index_n_heads, t.hidden_size), "BF16")
    if owns_keys:  # only KV sources produce index keys
        b.plain(p + "attn.indexer.wk.weight", (t.index_head_dim, t.head_dim), "BF16")
        b.plain(p + "attn.indexer.k_norm.weight", (t.index_head_dim,), "BF16")


def _ffn(b: _Builder, t: TextConfig, p: str, num_experts: int) -> None:
    b.plain(p + "ffn.gate.weight", (num_experts, t.hidden_size), "BF16")
    b.plain(p + "ffn.gate.bias", (num_experts,), "F32")
    b.plain(p + "ffn.gate.bias_vl", (num_experts,), "F32")
    experts(b, t.hidden_size, t.moe_intermediate_size, p, num_experts)


def experts(b: _Builder, h: int, inter: int, p: str, num_experts: int) -> None:
    """The shared expert (FP8 blocks) and the routed experts (FP4 rows) of one MoE."""
    for prefix, kind in [(p + "ffn.shared_experts.", TensorKind.FP8_BLOCK)] + [
        (f"{p}ffn.experts.{e}.", TensorKind.FP4_ROWS) for e in range(num_experts)
    ]:
        b.matrix(prefix + "w1.weight", inter, h, kind)
        b.matrix(prefix + "w2.weight", h, inter, kind)
        b.matrix(prefix + "w3.weight", inter, h, kind)


def _hyper_connections(b: _Builder, t: TextConfig, p: str) -> None:
    mixes = (2 + t.hc_mult) * t.hc_mult  # pre (n) + post (n) + comb (n x n)
    for site in ("attn", "ffn"):
        b.plain(f"{p}hc_{site}_fn", (mixes, t.hc_mult * t.hidden_size), "F32")
        b.plain(f"{p}hc_{site}_base", (mixes,), "F32")
        b.plain(f"{p}hc_{site}_scale", (3,), "F32")


def _engram(b: _Builder, t: TextConfig, p: str, rows: int) -> None:
    heads_total = (t.engram_max_ngram_size - 1) * t.engram_n_heads
    b.matrix(p + "engram.embed.weight", rows, t.engram_head_dim, TensorKind.FP8_ROWS)
    b.matrix(
        p + "engram.wkv.weight",
        t.hidden_size * (t.hc_mult + 1),
        heads_total * t.engram_head_dim,
        TensorKind.FP8_BLOCK,
    )
    b.plain(p + "engram.q_weight", (t.hc_mult, t.hidden_size), "BF16")
    b.plain(p + "engram.k_weight", (t.hc_mult, t.hidden_size), "BF16")


def _dspark_stage(b: _Builder, t: TextConfig, k: int) -> None:
    p, h = f"mtp.{k}.", t.hidden_size
    if k == 0:
        b.matrix(p + "main_proj.weight", h, h * len(t.dspark_target_layer_ids), TensorKind.FP8_BLOCK)
        b.plain(p + "main_norm.weight", (h,), "BF16")
    b.plain(p + "attn_norm.weight", (h,), "BF16")
    _attention(b, t, p)
    b.plain(p + "ffn_norm.weight", (h,), "BF16")
    _ffn(b, t, p, t.dspark_n_routed_experts)
    _hyper_connections(b, t, p)
    if k == t.num_nextn_predict_layers - 1:
        rank = t.dspark_markov_rank
        b.plain(p + "norm.weight", (h,), "BF16")
        b.plain(p + "markov_head.embed.weight", (t.vocab_size, rank), "BF16")
        b.plain(p + "markov_head.head.weight", (t.vocab_size, rank), "BF16")
        b.plain(p + "confidence_head.proj.weight", (1, h + rank), "BF16", also=("F32",))
