"""`serving` numerics against an independent reference of their rounding points, and their gap to `reference`.

The reference (`serving_ref`) is NeMo's FP32 model with DeepInfer's rounding points hooked in, on the same
released-format checkpoint. It runs on a "smooth" variant of each config where no discrete choice is left:
every expert is routed (`num_experts_per_tok == n_routed_experts`) and every visible compressed entry and
candidate block is selected.

Tolerance. Both sides compute the same FP32 values up to reduction order (~1e-7 relative), then round them
at the same points. A row therefore either matches to `ROW_TOL` (every BF16/FP8/FP4 rounding decision came
out the same) or differs by a "flip": an FP32 value a few ulps from a BF16 or FP8 rounding boundary lands
on the other side. One flipped FP8 value (2^-4 relative) perturbs the next GEMM inputs enough to move other
values across their boundaries, so in this small random model a flip cascades to differences of the size
of the quantization noise itself, in its row and in the later rows that attend to it. NeMo flips against
itself the same way (wide config: row 0 of a 24-token prompt is 4.5e-5 off its 1-token prompt's row 0).
Measured over 12 random 40-token prompts, 0.88 (tiny) and 0.83 (wide) of the rows match: a first flip
strikes about 0.7% (tiny) and 0.9% (wide) of the rows, so with `LENGTHS` about 0.9 of the rows are expected
to match. (Before the routed experts' BF16 points were on both sides the rates were 1.7% and 4.3%.) The
test asks that most rows match (`MIN_MATCHED`) and that no row exceeds the noise scale (`FLIP_MAX`).

A wrong rounding point is a different story: with one of our points removed or changed, few rows match.
None (0 of 480 rows, in each config): the routed experts' BF16 gate/up and down outputs missing from the
reference (`test_routed_expert_bf16_points_are_seen` keeps this). At most 6%: BF16 after wq_a, q_norm, the
query RoPE or the mHC expand; FP8 before wo_b or w2; the MoE output rounding. At most 22%: the SWA KV
path's BF16 wkv or RoPE output; the compressor's BF16 latent, norm or RoPE output; the shared expert's BF16
gate/up/down outputs; a BF16 rounding before the FP8 input of wo_b or of the shared w2. The index path
(indexer wq_b, wk, index-key and -query RoPE, head weights) cannot reach the logits of a config that
selects everything, so the prefill test also compares the values at every recorded boundary (`BOUNDARIES`)
on the matching rows: there, correct points leave < 0.1% of the values different (flips that did not reach
the logits), while any one of those index-path points reverted left 23-100% different (`MAX_DIFFERING`).
Not visible here: NVFP4 divide vs reciprocal (they differ only at exact ties) and the indexer head-weight
scale (rank-neutral, and the smooth config selects everything).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

pytest.importorskip("nemo_automodel")

from dsgraph.models.deepseek_v41.numerics import REFERENCE, SERVING, Numerics  # noqa: E402
from dsgraph.runtime.step_runner import StepRunner  # noqa: E402
from tests.oracle import model_fixtures as fx  # noqa: E402
from tests.oracle.nemo_ref import load_nemo_model, nemo_logits, select_all_overrides  # noqa: E402
from tests.oracle.serving_ref import ROUTED_BF16, Boundaries, serving_logits  # noqa: E402

LENGTHS = (1, 9, 24, 40)  # one batched prefill, one request per length
ROW_TOL = 1e-5  # a matching row: max |diff| <= ROW_TOL * max |logit| of the row
# Measured: tiny 0.986 (prefill), 1.000 (decode), wide 1.000; expected from the flip rates ~0.9 (before the
# routed BF16 points: tiny 1.000, wide 0.635). A wrong rounding point gave <= 0.22.
MIN_MATCHED = {"tiny": 0.8, "wide": 0.8}
MAX_MATCHED_WRONG = 0.1  # rows matched without the routed BF16 points (0.000 measured, see above)
FLIP_MAX = 0.3  # a flip cascade re-draws the quantization noise; rows of two draws differ by up to ~0.3
# Our debug record of each boundary NeMo's reference reports (serving_ref `boundaries=`).
BOUNDARIES = {"kv": "kv_pre", "ckv": "ckv_pre", "kidx": "kidx_pre", "iq": "iq_pre", "iw": "index_w"}
MAX_DIFFERING = 0.01  # measured <= 0.0007 (tiny, wide); a reverted index-path point gave >= 0.23


@dataclass(frozen=True)
class Gap:
    """Per-row relative errors max |got - want| / max |want| of a set of rows, and argmax agreement."""

    max: float
    median: float
    matched: float  # fraction of rows within ROW_TOL
    agreement: float  # fraction of rows with the same argmax
    rows: int

    def __str__(self) -> str:
        return (
            f"max {self.max:.3g}, median {self.median:.3g}, argmax agreement {self.agreement:.3f}, "
            f"rows within {ROW_TOL:g}: {self.matched:.3f} ({self.rows} rows)"
        )


def gap(got: list[torch.Tensor], want: list[torch.Tensor]) -> Gap:
    g, w = torch.cat(got), torch.cat(want)
    err = (g - w).abs().amax(-1) / w.abs().amax(-1)
    return Gap(
        max=float(err.max()),
        median=float(err.median()),
        matched=float((err <= ROW_TOL).float().mean()),
        agreement=float((g.argmax(-1) == w.argmax(-1)).float().mean()),
        rows=int(err.numel()),
    )


def smooth_overrides(model_dir: Path) -> dict[str, int]:
    text = fx.config(model_dir, None).text
    return {"num_experts_per_tok": text.n_routed_experts, **select_all_overrides(256)}


def prompts() -> list[list[int]]:
    return [fx.prompt(n, n) for n in LENGTHS]


def engine_run(
    model_dir: Path, num: Numerics, overrides: dict[str, int] | None, *, debug: bool = False
) -> tuple[StepRunner, list[torch.Tensor]]:
    r = fx.runner(model_dir, num, overrides, debug=debug)
    for rid in range(len(LENGTHS)):
        r.add(rid)
    return r, r.step(list(enumerate(prompts())))


def engine_logits(model_dir: Path, num: Numerics, overrides: dict[str, int] | None) -> list[torch.Tensor]:
    return engine_run(model_dir, num, overrides)[1]


def reference_logits(
    model_dir: Path, overrides: dict[str, int], *, routed_bf16: bool = True
) -> list[torch.Tensor]:
    nemo = load_nemo_model(model_dir, overrides)
    return [serving_logits(nemo, ids, routed_bf16=routed_bf16) for ids in prompts()]


def check_matches(g: Gap, what: str, min_matched: float) -> None:
    print(f"\n{what}: {g}")
    assert g.matched >= min_matched, f"{what}: only {g.matched:.3f} of rows within {ROW_TOL:g} ({g})"
    assert g.max <= FLIP_MAX, f"{what}: a row differs by {g.max:.3g} > {FLIP_MAX} ({g})"


def boundary_rows(kind: str, length: int, ratio: int) -> torch.Tensor:
    """Rows of a prompt that produce NeMo's boundary values: every row, or the rows closing a group."""
    rows = torch.arange(length)
    return rows[(rows + 1) % ratio == 0] if kind in ("ckv", "kidx") else rows


def differing_boundaries(
    r: StepRunner, got: list[torch.Tensor], want: list[torch.Tensor], nemo: list[Boundaries]
) -> dict[str, float]:
    """Per boundary kind, the fraction of values on rows with matching logits that differ from NeMo's
    (both sides hold BF16 values there, so a value either is equal or differs by at least one BF16 ulp)."""
    debug, ratios = r.last_debug, {p.index: p.ratio for p in r.model.plans}
    assert debug is not None
    counts: dict[str, list[int]] = {}
    start = 0
    for n, g, w, theirs in zip(LENGTHS, got, want, nemo, strict=True):
        matched = (g - w).abs().amax(-1) / w.abs().amax(-1) <= ROW_TOL
        for (layer, kind), value in theirs.items():
            rows = boundary_rows(kind, n, ratios[layer])
            ours = debug[f"{BOUNDARIES[kind]}.{layer}"][start : start + n][rows].float()
            assert ours.numel() == value.numel(), (
                f"layer {layer} {kind}: ours {ours.shape}, NeMo {value.shape}"
            )
            differ = (ours != value.reshape(ours.shape))[matched[rows]]
            c = counts.setdefault(kind, [0, 0])
            c[0], c[1] = c[0] + int(differ.sum()), c[1] + differ.numel()
        start += n
    return {kind: bad / max(total, 1) for kind, (bad, total) in counts.items()}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def tiny(root: str) -> Path:
    return fx.checkpoint("tiny", root)


@pytest.fixture(scope="module")
def tiny_smooth_serving(tiny: Path) -> list[torch.Tensor]:
    return engine_logits(tiny, SERVING, smooth_overrides(tiny))


@pytest.fixture(scope="module")
def tiny_smooth_reference(tiny: Path) -> list[torch.Tensor]:
    return engine_logits(tiny, REFERENCE, smooth_overrides(tiny))


def test_reference_hooks_come_off(tiny: Path) -> None:
    """The NeMo model is cached for the session: after a serving forward it must compute FP32 again."""
    nemo = load_nemo_model(tiny, smooth_overrides(tiny))
    ids = fx.prompt(3, 9)
    before = nemo_logits(nemo, ids)
    served = serving_logits(nemo, ids)
    assert torch.equal(nemo_logits(nemo, ids), before)
    assert not torch.allclose(served, before, rtol=0, atol=1e-3 * float(before.abs().max()))


def test_smooth_config_selects_everything(tiny: Path) -> None:
    cfg = fx.config(tiny, smooth_overrides(tiny))  # parse_config validates the overrides
    text = cfg.text
    assert text.num_experts_per_tok == text.n_routed_experts
    longest = max(LENGTHS) + 8  # the decode test runs 8 tokens past a prefill shorter than the longest prompt
    assert text.index_topk >= longest and text.candidate_topk_blocks * text.candidate_block_size >= longest


@pytest.mark.parametrize("name", sorted(fx.CONFIGS))
def test_serving_prefill_matches_reference_of_its_rounding_points(root: str, name: str) -> None:
    model_dir = fx.checkpoint(name, root)
    overrides = smooth_overrides(model_dir)
    r, got = engine_run(model_dir, SERVING, overrides, debug=True)
    nemo = load_nemo_model(model_dir, overrides)
    boundaries: list[Boundaries] = [{} for _ in LENGTHS]
    want = [serving_logits(nemo, ids, boundaries=b) for ids, b in zip(prompts(), boundaries, strict=True)]
    check_matches(gap(got, want), f"SERVING vs serving_ref ({name}, prefill)", MIN_MATCHED[name])
    # Every point the longest prompt passes (all of them) was compared.
    assert {f"{BOUNDARIES[k]}.{layer}" for layer, k in boundaries[-1]} == {
        key for key in r.last_debug or {} if key.partition(".")[0] in BOUNDARIES.values()
    }
    differing = differing_boundaries(r, got, want, boundaries)
    print(f"boundary values differing on matching rows: {differing}")
    assert max(differing.values()) <= MAX_DIFFERING, f"{name}: boundary values differ: {differing}"


def test_serving_decode_matches_reference_of_its_rounding_points(tiny: Path) -> None:
    """Prefill 16 tokens, then 8 single-token steps: every cache in its serving format (FP8 SWA ring,
    NVFP4 compressed pool, MXFP4 index keys, the compressor state) is read back by later steps."""
    overrides = smooth_overrides(tiny)
    ids = fx.prompt(5, 24)
    r = fx.runner(tiny, SERVING, overrides)
    r.add(0)
    got = r.step([(0, ids[:16])]) + [r.step([(0, [t])])[0] for t in ids[16:]]
    want = serving_logits(load_nemo_model(tiny, overrides), ids)
    check_matches(
        gap(got, [want]), "SERVING vs serving_ref (tiny, prefill 16 + 8 decode steps)", MIN_MATCHED["tiny"]
    )


def test_serving_gap_to_reference_smooth(
    tiny_smooth_serving: list[torch.Tensor], tiny_smooth_reference: list[torch.Tensor]
) -> None:
    """FP8 E4M3 keeps 3 mantissa bits: every FP8/FP4-weight GEMM input moves by up to 2^-4 of itself
    (~3.6% rms). Over ~8 GEMMs per layer and 6 layers of a random model the logits move by ~9% of
    their row maximum (measured); the bounds are about twice the measured values."""
    g = gap(tiny_smooth_serving, tiny_smooth_reference)
    print(f"\nSERVING vs REFERENCE (tiny, smooth): {g}")
    assert g.median <= 0.15 and g.max <= 0.4 and g.agreement >= 0.6, str(g)


def test_serving_gap_to_reference_tiny(tiny: Path) -> None:
    """With the tiny config's real choices (2 of 8 experts, top-3 entries, 2 candidate blocks) the
    quantization noise also flips routing and selections, and a flip moves a row by O(1) of its logits."""
    g = gap(engine_logits(tiny, SERVING, None), engine_logits(tiny, REFERENCE, None))
    print(f"\nSERVING vs REFERENCE (tiny): {g}")
    assert g.median <= 0.6 and g.max <= 2.0 and g.agreement >= 0.3, str(g)


def test_routed_expert_bf16_points_are_seen(
    tiny: Path, tiny_smooth_serving: list[torch.Tensor], tiny_smooth_reference: list[torch.Tensor]
) -> None:
    """The routed experts' BF16 gate/up and down outputs (`ROUTED_BF16`, inside the `moe_experts` op) are
    finer than FP8 (2^-9 vs 2^-4), yet leaving them out of the reference starts flip cascades in most
    rows, so the prefill match test would catch their absence from either side. They cost no accuracy:
    the reference without them is as far from REFERENCE as SERVING is (the smooth gap test's bounds)."""
    without = reference_logits(tiny, smooth_overrides(tiny), routed_bf16=False)
    ours, exact = gap(tiny_smooth_serving, without), gap(without, tiny_smooth_reference)
    print("\nleft out of the reference:\n  " + "\n  ".join(ROUTED_BF16))
    print(f"SERVING vs serving_ref without them (tiny, smooth): {ours}")
    print(f"serving_ref without them vs REFERENCE (tiny, smooth): {exact}")
    assert ours.matched <= MAX_MATCHED_WRONG, f"the routed BF16 points went unseen: {ours}"
    assert exact.median <= 0.15 and exact.max <= 0.4 and exact.agreement >= 0.6, str(exact)
