"""The buckets a bundle compiles: every (step kind, bucket) a session of its configuration can run.

A bundle's session pads every step dim to a power of two on every platform (as the cuda session always
does), so the bucket list is finite: token rows up to the padded `max_num_batched_tokens`, sequences up
to the padded `max_num_seqs` (never more than the rows), sampled rows up to the rows, and for a compact
truncated prefill its decoder rows (`kept`) up to the rows. The drafter's buckets are sequence counts.

A bucket is named by its step dims (`tokens8-seqs2-outs4`); the cache dims (slots, pages) are the same
for every bucket of a bundle and recorded once in its manifest.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsgraph.runtime.step_padding import bucket_size

__all__ = ["KINDS", "BucketSpec", "bucket_name", "enumerate_buckets", "parse_bucket_name", "powers_upto"]

# step kind -> what it is: the target step, its truncated-prefill variant, the DSpark draft pass
KINDS = {
    "step": "the target step (prefill, decode and verify rows)",
    "truncated": "the truncated-prefill variant of the target step",
    "draft": "the DSpark draft pass (bucketed by sequences)",
    "draft_greedy": "the draft pass of greedy requests only (no log-probabilities; bucketed by sequences)",
}
STEP_DIM_ORDER = ("tokens", "seqs", "outs", "kept")


@dataclass(frozen=True)
class BucketSpec:
    """What fixes a bundle's bucket list."""

    max_num_batched_tokens: int
    max_num_seqs: int
    truncation: str  # "off", "mask" or "compact"
    drafting: bool


def powers_upto(n: int) -> list[int]:
    """1, 2, 4, ... up to the padded size of n."""
    return [1 << i for i in range(bucket_size(n).bit_length())]


def bucket_name(dims: dict[str, int]) -> str:
    return "-".join(f"{d}{dims[d]}" for d in STEP_DIM_ORDER if d in dims)


def parse_bucket_name(name: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in name.split("-"):
        dim = part.rstrip("0123456789")
        if dim not in STEP_DIM_ORDER or dim == part:
            raise ValueError(f"bucket name {name!r}: part {part!r} is not a step dim and a size")
        out[dim] = int(part[len(dim) :])
    return out


def _step_buckets(spec: BucketSpec, with_kept: bool) -> list[dict[str, int]]:
    out = []
    for tokens in powers_upto(spec.max_num_batched_tokens):
        for seqs in powers_upto(min(tokens, bucket_size(spec.max_num_seqs))):
            for outs in powers_upto(tokens):
                for kept in powers_upto(tokens) if with_kept else [0]:
                    dims = {"tokens": tokens, "seqs": seqs, "outs": outs}
                    out.append({**dims, "kept": kept} if with_kept else dims)
    return out


def enumerate_buckets(spec: BucketSpec) -> dict[str, list[str]]:
    """Step kind -> bucket names, in a stable order."""
    kinds = {"step": [bucket_name(d) for d in _step_buckets(spec, False)]}
    if spec.truncation != "off":
        kinds["truncated"] = [bucket_name(d) for d in _step_buckets(spec, spec.truncation == "compact")]
    if spec.drafting:
        for kind in ("draft", "draft_greedy"):
            kinds[kind] = [f"seqs{s}" for s in powers_upto(spec.max_num_seqs)]
    return kinds
