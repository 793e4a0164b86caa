"""The steps `dsgraph compile` runs to warm a bucket (on cuda, to compile its kernels and capture it):
each one runs, on the tiny model on cpu, in exactly the bucket it is built for, truncated-prefill
buckets included (compact with its kept rows, mask); only buckets that sample more rows than they keep,
which no engine step reaches, are left unwarmed."""

from __future__ import annotations

import pytest

from dsgraph.runtime.bundle.buckets import BucketSpec, enumerate_buckets, parse_bucket_name
from dsgraph.runtime.bundle.compile import _warm_step
from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.session import STEP_DIMS
from dsgraph.tools.generate_cmd import default_model_dir


@pytest.mark.parametrize("mode", ["compact", "mask"])
def test_every_reachable_bucket_is_warmed_in_itself(mode: str) -> None:
    config = EngineConfig.from_flat(
        max_model_len=128, max_num_seqs=2, max_num_batched_tokens=8, prefill_truncation=mode
    )
    engine = Engine(default_model_dir(), config)
    session = engine.session
    buckets = enumerate_buckets(BucketSpec(8, 2, mode, False))
    skipped = []
    for kind in ("step", "truncated"):
        for name in buckets[kind]:
            dims = parse_bucket_name(name)
            step = _warm_step(engine, kind, dims)
            if step is None:
                skipped.append(name)
                continue
            _, sizes, _, _ = session._bucket(step)
            assert {d: sizes[d] for d in STEP_DIMS if d in dims} == dims, (kind, name)
            assert ("seq_decoder_window_start" in step) == (kind == "truncated"), (kind, name)
            logits = session.run(step)
            assert logits.shape[0] == dims["outs"] and bool(logits.isfinite().all()), (kind, name)
    want = [
        n for n in buckets["truncated"] if parse_bucket_name(n)["outs"] > parse_bucket_name(n).get("kept", 8)
    ]
    assert skipped == want
    assert len(skipped) < len(buckets["truncated"])
