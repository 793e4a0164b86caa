"""A bundle's bucket list (runtime/bundle/buckets.py) holds the bucket of every step its configuration
can run: any real rows, sequences and sampled rows within the limits, padded to powers of two."""

from __future__ import annotations

import pytest

from dsgraph.runtime.bundle.buckets import BucketSpec, bucket_name, enumerate_buckets, parse_bucket_name
from dsgraph.runtime.step_padding import bucket_size


@pytest.mark.parametrize(("tokens", "seqs"), [(8, 2), (100, 3), (1, 1)])
def test_every_padded_step_has_its_bucket(tokens: int, seqs: int) -> None:
    listed = set(enumerate_buckets(BucketSpec(tokens, seqs, "off", False))["step"])
    for t in range(1, tokens + 1):
        for s in range(1, min(t, seqs) + 1):
            for o in range(0, t + 1):  # a middle prefill chunk samples no row
                dims = {"tokens": bucket_size(t), "seqs": bucket_size(s), "outs": bucket_size(o)}
                assert bucket_name(dims) in listed, dims


def test_kinds_follow_truncation_and_drafting() -> None:
    kinds = enumerate_buckets(BucketSpec(4, 2, "compact", True))
    assert kinds["draft"] == ["seqs1", "seqs2"]
    assert "tokens4-seqs2-outs1-kept4" in kinds["truncated"] and len(kinds["step"]) == 1 + 4 + 6
    assert "kept" not in enumerate_buckets(BucketSpec(4, 2, "mask", False))["truncated"][0]
    assert parse_bucket_name("tokens4-seqs2-outs1-kept4") == {"tokens": 4, "seqs": 2, "outs": 1, "kept": 4}
    with pytest.raises(ValueError, match="'rows4' is not a step dim"):
        parse_bucket_name("rows4-seqs1")
