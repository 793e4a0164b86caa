"""The cuda `swa_write`, `paged_write` (Triton row copies) and `compress` rules (kernels/cache.py) against
the cpu rules: the same bytes in the same cache rows, written in place, and the cpu rules' errors;
compress's f32 results within 1e-5 (f32 dots in another order).

On a CUDA machine the kernels run on the GPU; elsewhere under Triton's interpreter (TRITON_INTERPRET=1,
set before triton is imported). Copies of bytes: results must be equal.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")  # tests/cuda/conftest.py switches the interpreter on where there is no GPU

from dsgraph.platform.cpu import rules_cache  # noqa: E402
from dsgraph.platform.cpu.step_rows import unchecked  # noqa: E402
from dsgraph.platform.cuda.kernels import cache  # noqa: E402
from tests.cuda.kernel_env import DEVICE, on_device  # noqa: E402

I32 = torch.int32


def _i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=I32)


def _bytes(*shape: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def _swa_operands() -> list[torch.Tensor]:
    """Sequence 0: a 7-row chunk (positions 3..9) into a ring of 5 with seq_end 12 (as if rows 10, 11 were
    elsewhere), so only 7..9 are written and the rows of 5, 6 keep their bytes; sequence 1: one row at
    position 12; a padding row; sequence 2 owns no row and has a slot past the ring (never read)."""
    ring = _bytes(3, 5, 33, seed=1)
    entries = _bytes(9, 33, seed=2)
    positions = _i32([3, 4, 5, 6, 7, 8, 9, 12, 0])
    seq_ids = _i32([0] * 7 + [1, -1])
    return [ring, entries, positions, seq_ids, _i32([2, 0, 7]), _i32([12, 13, 1])]


@pytest.mark.parametrize("checked", [True, False])
def test_swa_write_writes_the_cpu_rule_bytes_in_place(checked: bool) -> None:
    args = _swa_operands()
    want = rules_cache.swa_write(None, *args)
    ring = args[0].clone().to(DEVICE)
    device_args = [a.to(DEVICE) for a in args[1:]]
    if checked:
        got = cache.swa_write(None, ring, *device_args)
    else:
        with unchecked():
            got = cache.swa_write(None, ring, *device_args)
    assert got is ring and torch.equal(got.cpu(), want)
    assert not torch.equal(want, args[0]), "the step must change the ring"


def test_swa_write_raises_the_cpu_rule_errors() -> None:
    args = _swa_operands()
    args[4] = _i32([2, 2, 7])  # sequences 0 and 1 share slot 2: positions 7 and 12 both hit row 2
    for rule in (rules_cache.swa_write, cache.swa_write):
        with pytest.raises(ValueError, match="rows 4 and 7 both write one ring row"):
            rule(None, *[a.to(DEVICE) if rule is cache.swa_write else a for a in args])


def _paged_operands() -> list[torch.Tensor]:
    """Blocks of 4 entries; sequence 1's table has an unallocated block; row 3 is not valid (writes
    nothing) and row 5 is padding."""
    pool = _bytes(6, 4, 17, seed=3)
    entries = _bytes(6, 17, seed=4)
    entry_ids = _i32([0, 5, 6, 9, 2, 1])
    valid = torch.tensor([True, True, True, False, True, True])
    seq_ids = _i32([0, 0, 0, 1, 1, -1])
    table = _i32([[4, 1, 3], [2, -1, 0]])
    return [pool, entries, entry_ids, valid, seq_ids, table]


@pytest.mark.parametrize("checked", [True, False])
def test_paged_write_writes_the_cpu_rule_bytes_in_place(checked: bool) -> None:
    args = _paged_operands()
    want = rules_cache.paged_write(None, *args)
    pool = args[0].clone().to(DEVICE)
    device_args = [a.to(DEVICE) for a in args[1:]]
    if checked:
        got = cache.paged_write(None, pool, *device_args)
    else:
        with unchecked():
            got = cache.paged_write(None, pool, *device_args)
    assert got is pool and torch.equal(got.cpu(), want)
    assert not torch.equal(want, args[0]), "the step must change the pool"


@pytest.mark.parametrize(
    ("entry", "match"),
    [(5, "row 3 \\(sequence 1\\) needs entry 5, in block -1"), (2, "rows 3 and 4 both write one pool row")],
)
def test_paged_write_raises_the_cpu_rule_errors(entry: int, match: str) -> None:
    args = _paged_operands()
    args[2][3], args[3][3] = entry, True
    for rule in (rules_cache.paged_write, cache.paged_write):
        with pytest.raises((IndexError, ValueError), match=match):
            rule(None, *[a.to(DEVICE) if rule is cache.paged_write else a for a in args])


def test_unchecked_rows_with_out_of_range_targets_write_nothing() -> None:
    args = _paged_operands()
    args[2][0] = 12  # past sequence 0's table of 3 blocks of 4
    pool = args[0].clone().to(DEVICE)
    with unchecked():
        got = cache.paged_write(None, pool, *[a.to(DEVICE) for a in args[1:]])
    args[3][0] = False  # the cpu rule without the bad row
    assert torch.equal(got.cpu(), rules_cache.paged_write(None, *args))


def test_the_cuda_platform_runs_these_rules_in_place() -> None:
    from dsgraph.platform.cuda.target import INPLACE, PLATFORM

    for op in ("swa_write", "paged_write"):
        assert PLATFORM.rules[op] is cache.RULES[op] and op in INPLACE, op


ENCODINGS = ("fp8_g32", "mxfp4_g32", "nvfp4_g16_recip")


def _with_values(
    args: list[torch.Tensor], fmt: str, seed: int, specials: bool = True
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The write's operands with 64-wide bf16 values in place of its entries and a cache of fmt's entries
    (the values with a NaN, infinities and a -0 unless not `specials`), and the same with those values
    encoded (cache_encode)."""
    from dsgraph.ops.quant import QdqParams, entry_bytes
    from dsgraph.platform.cuda.kernels import quant_act

    rows = args[1].shape[0]
    values = (torch.randn(rows, 64, generator=torch.Generator().manual_seed(seed)) * 3).bfloat16()
    if specials:
        values[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    cache_rows = _bytes(*args[0].shape[:2], entry_bytes(fmt, 64), seed=seed + 1)
    fused = [cache_rows, values, *args[2:]]
    encoded = quant_act.cache_encode(QdqParams(fmt=fmt), values.to(DEVICE)).cpu()
    return fused, [cache_rows.clone(), encoded, *args[2:]]


@pytest.mark.parametrize("checked", [True, False])
@pytest.mark.parametrize("fmt", ENCODINGS)
def test_encoding_writes_are_encode_then_write(fmt: str, checked: bool) -> None:
    """encode_swa_write / encode_paged_write (ops/fused.py): the bytes of cache_encode's kernel then the
    write's, in place, non-finite values included; and the cpu meaning's bytes (finite values: a NaN's
    sign bit is the platform's)."""
    from dsgraph.ops.quant import QdqParams
    from dsgraph.platform.cpu import rules_fused

    p = QdqParams(fmt=fmt)
    for name, operands, write in (
        ("swa", _swa_operands(), cache.swa_write),
        ("paged", _paged_operands(), cache.paged_write),
    ):
        fused, encoded = _with_values(operands, fmt, seed=len(name))
        want = write(None, *on_device(encoded))
        target = fused[0].to(DEVICE)
        rule = getattr(cache, f"encode_{name}_write")
        if checked:
            got = rule(p, target, *on_device(fused[1:]))
        else:
            with unchecked():
                got = rule(p, target, *on_device(fused[1:]))
        assert got is target and torch.equal(got.cpu(), want.cpu()), f"{name} {fmt}"
        fused, encoded = _with_values(operands, fmt, seed=len(name), specials=False)
        got = rule(p, fused[0].to(DEVICE), *on_device(fused[1:]))
        cpu_rule = getattr(rules_fused, f"encode_{name}_write")
        assert torch.equal(cpu_rule(p, *fused), got.cpu()), f"{name} {fmt} vs the cpu rules"


def _compress_operands(ratio: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Sequence 0: a chunk at positions 3..7 (its first row closes a group with the state's position 2);
    sequence 1: positions 0, 1; a padding row. State ring of 3 positions per slot."""
    g = torch.Generator().manual_seed(ratio)
    u = torch.randn(8, 64, generator=g)
    wkv = (torch.randn(32, 64, generator=g) * 0.125).to(dtype)
    step = [_i32([3, 4, 5, 6, 7, 0, 1, 0]), _i32([0] * 5 + [1, 1, -1]), _i32([2, 0]), _i32([3, 0])]
    if ratio == 1:
        return [u, wkv, *step]
    wgate = (torch.randn(32, 64, generator=g) * 0.125).to(dtype)
    return [u, wkv, wgate, torch.randn(3, 3, 2, 32, generator=g), *step]


def _compress_params(ratio: int, out_dtype: str = "f32") -> SimpleNamespace:
    return SimpleNamespace(ratio=ratio, out_dtype=out_dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("ratio", [1, 2])
def test_compress_matches_the_cpu_rule_and_updates_the_state_in_place(ratio: int, dtype: torch.dtype) -> None:
    args = _compress_operands(ratio, dtype)
    want = rules_cache.compress(_compress_params(ratio), *args)
    device_args = on_device(args)
    got = cache.compress(_compress_params(ratio), *device_args)
    assert len(got) == len(want)
    torch.testing.assert_close(got[0].cpu(), want[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1].cpu(), want[1])
    if ratio == 2:
        assert got[2] is device_args[3]
        torch.testing.assert_close(got[2].cpu(), want[2], rtol=1e-5, atol=1e-5)
        assert not torch.equal(want[2], args[3]), "the step must change the state"


@pytest.mark.parametrize("weights", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("ratio", [1, 2])
def test_compress_reads_bf16_u_and_rounds_latent_once(ratio: int, weights: torch.dtype) -> None:
    """Serving numerics hand compress the BF16 u and take a BF16 latent (no cast launches around it): the
    same projections as u's f32 values (the ring state too), and latent the f32 latent rounded once to
    BF16, bit for bit, on each platform; padding and non-closing rows 0."""
    args = _compress_operands(ratio, weights)
    args[0] = args[0].to(torch.bfloat16)
    as_f32 = [args[0].float(), *args[1:]]
    copies = [(rules_cache.compress, lambda a: [t.clone() for t in a]), (cache.compress, on_device)]
    for rule, place in copies:
        plain = rule(_compress_params(ratio), *place(as_f32))
        got = rule(_compress_params(ratio, "bf16"), *place(args))
        assert got[0].dtype == torch.bfloat16 and torch.equal(got[1].cpu(), plain[1].cpu())
        assert torch.equal(got[0].cpu(), plain[0].cpu().to(torch.bfloat16)), rule
        if ratio == 2:
            assert torch.equal(got[2].cpu(), plain[2].cpu())
        assert not bool(got[0][~got[1]].any()) and bool(got[0].any())


def test_compress_names_a_closing_row_that_does_not_follow_its_group_start() -> None:
    """Checked, the cuda rule raises the cpu rule's error for a closing row whose previous row is not the
    position before it (here position 5 after 3): the kernel would pool with the wrong first token."""
    args = _compress_operands(2, torch.float32)
    args[-4] = _i32([3, 5, 4, 6, 7, 0, 1, 0])
    for rule in (rules_cache.compress, cache.compress):
        with pytest.raises(ValueError, match=r"row 1 \(position 5\) does not follow the row of position 4"):
            rule(_compress_params(2), *on_device(args))


@pytest.mark.parametrize("out_dtype", ["bf16", "f32"])
@pytest.mark.parametrize("ratio", [1, 2])
def test_compress_norm_is_compress_then_the_norm(ratio: int, out_dtype: str) -> None:
    """compress_norm (ops/fused.py: the compressor's norm in compress's launch) gives the bits of the cuda
    compress rule followed by the cuda rms_norm rule (padding and non-closing rows included: their zero
    latent normalizes to 0), writes the same state in place, and its cpu rule is the two cpu rules."""
    from dsgraph.ops.fused import CompressNormParams
    from dsgraph.ops.nn import RMSNormParams
    from dsgraph.platform.cpu import rules_core, rules_fused
    from dsgraph.platform.cuda.kernels import norm_rope

    args = _compress_operands(ratio, torch.float32)
    args[0] = args[0].to(torch.bfloat16) if out_dtype == "bf16" else args[0]
    weight = (1 + 0.25 * torch.randn(32, generator=torch.Generator().manual_seed(7))).to(args[0].dtype)
    p = CompressNormParams(ratio=ratio, eps=1e-6, out_dtype=out_dtype)
    norm = RMSNormParams(eps=1e-6)
    two = on_device(args)
    plain = cache.compress(_compress_params(ratio, out_dtype), *two)
    want = (norm_rope.rms_norm(norm, plain[0], weight.to(DEVICE)), *plain[1:])
    fused_args = on_device([*args, weight])
    got = cache.compress_norm(p, *fused_args)
    assert len(got) == len(want) and got[0].dtype == want[0].dtype
    for g, w, what in zip(got, want, ("normed latent", "closes", "state"), strict=False):
        assert torch.equal(g.cpu(), w.cpu()), what
    if ratio == 2:
        assert got[2] is fused_args[3], "the state is written in place"
    assert bool(got[0].any()) and not bool(got[0][~got[1]].any())
    cpu = rules_fused.compress_norm(p, *[t.clone() for t in args], weight)
    compressed = rules_cache.compress(_compress_params(ratio, out_dtype), *[t.clone() for t in args])
    assert torch.equal(cpu[0], rules_core.rms_norm(norm, compressed[0], weight))
    assert all(torch.equal(a, b) for a, b in zip(cpu[1:], compressed[1:], strict=True))
