"""An ahead-of-time bundle on the GPU (docs/bundle.md): compiled, cold and bundle starts of the tiny model
each in a fresh process with empty caches (tools/bench/bundle_start.py); the bundle start compiles no
kernel and lowers no program, and gives the cold start's first token."""

from __future__ import annotations

import argparse

import pytest
import torch

from dsgraph.tools.bench import bundle_start
from dsgraph.tools.generate_cmd import default_model_dir

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("truncation", ["off", "compact"])
def test_a_bundle_start_compiles_no_kernel(truncation: str) -> None:
    """With compact truncation the compile also runs every reachable truncated bucket, and the start's
    24-token prompt runs truncated (the tiny model keeps 14 rows: window 8 + backtrack 6) from the
    bundle's kernels."""
    parser = argparse.ArgumentParser()
    bundle_start.add_arguments(parser)
    args = parser.parse_args(
        ["--platform", "cuda", "--model", str(default_model_dir()), "--max-num-batched-tokens", "16"]
        + ["--prefill-truncation", truncation]
    )
    result = bundle_start.measure(args)
    assert result is not None and result["same_first_token"]
    assert result["compile"]["kernels_in_bundle"] > 0
    assert result["bundle"]["kernels_compiled_at_start"] == 0
    assert result["bundle"]["programs_built"] == 0 and result["cold"]["programs_built"] > 0
