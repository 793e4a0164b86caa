"""The benchmark model: V4.1-Flash at full width (hidden 5120, 64 heads x 512, 384 experts x 2304,
real vocabulary, index and candidate sizes) truncated to 8 layers that keep every layer mode, in the
released order: SWA, SWA + Engram, Full r=2, Reuse r=2, Full r=1 (candidate source), Reindex r=1,
Reuse r=1, Reuse r=1. Engram tables are shrunk (their row count only sets memory, not work per token).
`LAYER_COUNTS_40` says how many layers of each kind the 40-layer model has, for extrapolation.
"""

from __future__ import annotations

from typing import Any

from dsgraph.models.deepseek_v41.config import ModelConfig, parse_config
from dsgraph.models.deepseek_v41.engram_hash import table_rows
from dsgraph.models.deepseek_v41.flash import flash_config_dict

BENCH_LAYERS = 8
# layer kind -> (count in the 8-layer bench model, count in the released 40-layer model)
LAYER_COUNTS = {
    "swa": (2, 2),
    "full_r2": (1, 3),
    "reuse_r2": (1, 15),
    "full_r1": (1, 1),
    "reindex_r1": (1, 4),
    "reuse_r1": (2, 15),
}


def bench_config_dict(engram_vocab: int = 1_000_000, extra_reuse: int = 0) -> dict[str, Any]:
    """`extra_reuse` adds that many Reuse layers of each ratio (used to measure one layer's cost)."""
    r2 = [2, 2] + [2] * extra_reuse
    r1 = [1, 1, 1, 1] + [1] * extra_reuse
    ratios = [0, 0, *r2, *r1]
    full_r1 = 2 + len(r2)
    n = len(ratios)
    text = {
        "num_hidden_layers": n,
        "compress_ratios": ratios + [0, 0, 0],
        "kv_source_layer_ids": [2, full_r1],
        "index_source_layer_ids": [2, full_r1, full_r1 + 1],
        "candidate_source_layer_id": full_r1,
        "engram_layer_ids": [1],
        "engram_vocab_size": engram_vocab,
        "engram_num_embeddings": list(table_rows([1], engram_vocab, 8, 4)),
        "dspark_target_layer_ids": [n - 3, n - 2, n - 1],
    }
    return flash_config_dict(**text)


def bench_config(engram_vocab: int = 1_000_000, extra_reuse: int = 0) -> ModelConfig:
    return parse_config(bench_config_dict(engram_vocab, extra_reuse))
