"""The tiny V4.1 graphs' programs on the cuda platform equal their goldens (tests/golden/v41/*.cuda.txt):
which rule, and which Triton kernels, each equation runs. Lowering needs no GPU, only the kernel modules
(triton), so this runs on CPU machines with triton too; tests/cuda/test_kernel_imports.py fails if a
kernel module does not import, so a fallback to a cpu rule cannot slip into these dumps unnoticed.

On a GPU, the captured decode bucket of a session on the tiny checkpoint (which steps are captured into
graphs and which run eagerly, and why) equals tests/golden/v41/gpu/decode.captured.txt; regenerate it on
the GPU with `pytest tests/cuda/test_cuda_program_golden.py --update-goldens`.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

import pytest

from dsgraph.tools.graph_dumps import GRAPHS, dump_graph, stage_names
from tests.golden.check import check_golden

V41 = Path(__file__).resolve().parents[1] / "golden" / "v41"
NAMES = [(case, stage) for case in GRAPHS for stage in stage_names(GRAPHS[case], ("cuda",)) if "." in stage]
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed on this machine"
)


@cache
def _dumps(case: str) -> dict[str, str]:
    return dump_graph(GRAPHS[case], ("cuda",))


@needs_triton
@pytest.mark.parametrize(("case", "stage"), [n for n in NAMES if n[1].endswith(".cuda")])
def test_cuda_program_matches_golden(case: str, stage: str, update_goldens: bool) -> None:
    check_golden(V41 / case / f"{stage}.txt", _dumps(case)[stage], update_goldens)


@needs_triton
def test_the_cuda_programs_name_their_kernels() -> None:
    text = _dumps("step")["decode.cuda"]
    assert "-> cuda.kernels.attention.attention  launches: attention_tl.split_kernel" in text
    assert "(fallback" not in text


@pytest.mark.gpu
def test_captured_decode_bucket_matches_golden(
    tmp_path_factory: pytest.TempPathFactory, update_goldens: bool
) -> None:
    from dsgraph.runtime.engine_config import EngineConfig
    from dsgraph.runtime.session import Session
    from tests.oracle import model_fixtures as fx

    model_dir = fx.checkpoint("tiny", str(tmp_path_factory.getbasetemp()))
    config = EngineConfig.from_flat(platform="cuda", max_model_len=64, max_num_seqs=2)
    session = Session.from_checkpoint(model_dir, config)
    seqs = [session.open_sequence() for _ in range(2)]
    builder = session.new_step()
    for i, seq in enumerate(seqs):
        builder.add(seq, [5 + i, 6, 7])
    session.run(builder.build())
    builder = session.new_step()
    for seq in seqs:
        builder.add(seq, [8])
    session.run(builder.build())
    assert session.captures == 2, session.captures
    key = next(k for k in session.captured if dict(k)["tokens"] == 2)  # decode: 2 sequences, a token each
    check_golden(V41 / "gpu" / "decode.captured.txt", session.captured[key].as_text(), update_goldens)
