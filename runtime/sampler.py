"""The sampling step: one lowered `sample` program per (rows, top-logprobs) shape, fed per-row params;
and the verification of a speculative step (`spec_verify`, exact rejection sampling, ops/spec_sampling.py),
one program per (rows, sequences) shape. Either takes an optional allowed-token bitmask (structured
output, runtime/structured/): steps without one run the programs without the mask operand.

Sampling runs on the platform of the logits (the session's: `platform`, or by default the platform of
the logits' device), through that platform's bucketed runner, eagerly: rows are not padded, so a
program exists per row count and none is captured.

Each call picks the `sample` op's `processing` variant (ops/sampling.py) from its rows' params on the
host (`processing_for`): steps that cannot change any row's result are not run, with the same bits as
the full processing, and each variant has its own graph and programs; greedy steps whose
log-probabilities nobody reads (`reads_logprobs`) take the token alone ("greedy_token")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dsgraph.graph import Graph, TensorType, make_graph
from dsgraph.graph.passes import specialize
from dsgraph.ops import op
from dsgraph.ops.sampling import GREEDY_BELOW, PROCESSING, mask_words
from dsgraph.platform.registry import BucketRunner, Platform, Program, lower, make_runner, platform_of
from dsgraph.runtime.replay import replay_table
from dsgraph.runtime.sampling_params import SamplingParams


def sample_graph_name(masked: bool, processing: str) -> str:
    """The name of the `sample` graph of a processing variant, with or without the bitmask operand."""
    base = "sample_masked" if masked else "sample"
    return base if processing == "full" else f"{base}_{processing}"


GRAPHS = (
    "sample",
    "spec_verify",
    "sample_masked",
    "spec_verify_masked",
    *(sample_graph_name(masked, p) for masked in (False, True) for p in PROCESSING if p != "full"),
)


def processing_for(rows: Sequence[torch.Tensor], vocab_size: int, read_logprobs: bool = True) -> str:
    """The `sample` op's processing for rows (temperature, top_p, top_k, min_p as the op's f32/i32
    operands hold them, on the host, so that rounding to f32 is decided as the op sees it): when every row
    is greedy "greedy", or "greedy_token" if nothing reads their log-probabilities and top ids
    (`read_logprobs` False, `reads_logprobs`); "untruncated" when each row is greedy or has top_k off,
    top_p >= 1 and min_p <= 0, else "full". The comparisons are the op rule's own
    (platform/cpu/rules_sampling.py)."""
    temperature, top_p, top_k, min_p = rows[:4]
    greedy = temperature < GREEDY_BELOW
    if bool(greedy.all()):
        return "greedy" if read_logprobs else "greedy_token"
    k = top_k.long()
    k_off = (k < 1) | (k >= vocab_size)
    untruncated = greedy | (k_off & (top_p.double() >= 1.0) & (min_p.double() <= 0.0))
    return "untruncated" if bool(untruncated.all()) else "full"


def reads_logprobs(params: Sequence[SamplingParams]) -> bool:
    """Whether anything reads the sampled log-probabilities or top ids of rows with these params: only the
    outputs of requests that ask for them (`logprobs` not None; the offline and server APIs show none
    otherwise). The rest of the engine does not: prompt logprobs and forced tokens' logprobs are computed
    from the logits, speculative verification decides with its own op (`spec_verify`, the full
    probabilities) or, deterministic, by the sampled tokens, and overlapped steps write a bad row's cause
    over its logprob (runtime/row_checks.py)."""
    return any(p.logprobs is not None for p in params)


@dataclass(frozen=True)
class Samples:
    tokens: torch.Tensor  # [outs] i32
    logprobs: torch.Tensor  # [outs] f32, of the chosen token under the processed distribution
    top_logprobs: torch.Tensor  # [outs, K] f32
    top_ids: torch.Tensor  # [outs, K] i32


class Sampler:
    def __init__(
        self,
        vocab_size: int,
        num_top_logprobs: int = 20,
        graphs: Mapping[str, Graph] | None = None,
        *,
        platform: str | Platform | None = None,
    ) -> None:
        """`graphs`: the sampling graphs by name (GRAPHS) as a bundle stores them, instead of tracing;
        names it lacks (a bundle written before the processing variants) are traced, as without one.
        `platform`: where sampling runs (None: the platform of each call's logits' device)."""
        self.vocab, self.k, self.platform = vocab_size, num_top_logprobs, platform
        self.runners: dict[tuple[str, torch.device], BucketRunner] = {}
        given = dict(graphs or {})
        traced = self._trace(vocab_size) if any(n not in given for n in GRAPHS) else {}
        self.graphs: dict[str, Graph] = {n: given[n] if n in given else traced[n] for n in GRAPHS}
        self.programs: dict[tuple[str, str, Any], Program] = {}  # (graph, platform, shape key) -> program

    def _trace(self, vocab_size: int) -> dict[str, Graph]:
        logits = TensorType(("outs", vocab_size), "f32")
        row = [TensorType(("outs",), d) for d in ("f32", "f32", "i32", "f32", "i64", "i32")]
        verify_in = [logits, TensorType(("outs",), "i32"), logits, *row, *[TensorType(("seqs",), "i32")] * 2]
        # both again with the allowed-token bitmask as their last operand (structured output)
        allowed = TensorType(("outs", mask_words(vocab_size)), "i32")
        out = {
            "spec_verify": make_graph(self._verify_fn, *verify_in, name="spec_verify"),
            "spec_verify_masked": make_graph(self._verify_fn, *verify_in, allowed, name="spec_verify_masked"),
        }
        for processing in PROCESSING:
            for masked in (False, True):
                name = sample_graph_name(masked, processing)
                operands = [logits, *row, *([allowed] if masked else [])]
                out[name] = make_graph(self._sample_fn(processing), *operands, name=name)
        return out

    def _sample_fn(self, processing: str) -> Any:
        def fn(logits, temperature, top_p, top_k, min_p, seed, position, *allowed):  # type: ignore[no-untyped-def]
            token, logprob, top_lp, top_ids = op.sample(
                logits,
                temperature,
                top_p,
                top_k,
                min_p,
                seed,
                position,
                *allowed,
                num_top_logprobs=self.k,
                processing=processing,
            )
            return {"token": token, "logprob": logprob, "top_logprobs": top_lp, "top_ids": top_ids}

        return fn

    def _verify_fn(self, *operands: Any) -> dict[str, Any]:
        """Operands in `spec_verify` order (logits, draft, draft_logprobs, row params, starts, lengths)."""
        num_accepted, token, logprob = op.spec_verify(*operands)
        return {"num_accepted": num_accepted, "token": token, "logprob": logprob}

    @staticmethod
    def _rows(params: Sequence[SamplingParams], seeds: Sequence[int]) -> list[torch.Tensor]:
        rows = [p.op_row() for p in params]
        return [
            torch.tensor([r[0] for r in rows], dtype=torch.float32),
            torch.tensor([r[1] for r in rows], dtype=torch.float32),
            torch.tensor([r[2] for r in rows], dtype=torch.int32),
            torch.tensor([r[3] for r in rows], dtype=torch.float32),
            torch.tensor(list(seeds), dtype=torch.int64),
        ]

    def verify(
        self,
        logits: torch.Tensor,
        draft_tokens: torch.Tensor,
        draft_logprobs: torch.Tensor,
        params: Sequence[SamplingParams],
        seeds: Sequence[int],
        positions: torch.Tensor,
        verify_start: torch.Tensor,
        verify_len: torch.Tensor,
        allowed: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`spec_verify` over the sample rows: (num_accepted [seqs], token [outs], logprob [outs]); row i
        holds the draft of the next row (`draft_tokens[i]`, drawn from `draft_logprobs[i]`), is decided
        with params[i], seeds[i] at positions[i]; sequence s owns rows verify_start[s] + 0..len-1."""
        n, seqs = logits.shape[0], verify_start.shape[0]
        graph = self.graphs["spec_verify" if allowed is None else "spec_verify_masked"]
        args = [
            logits.float(),
            draft_tokens.to(torch.int32),
            draft_logprobs.float(),
            *self._rows(params, seeds),
        ]
        args += [positions.to(torch.int32), verify_start.to(torch.int32), verify_len.to(torch.int32)]
        args += [] if allowed is None else [allowed]
        args = [a.to(logits.device) for a in args]  # sampling runs where the logits are
        out = self._run(graph, (n, seqs), {"outs": n, "seqs": seqs}, args)
        # decided on the device; the small results come back to the host in one go per step
        return out["num_accepted"].cpu(), out["token"].cpu(), out["logprob"].cpu()

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        seeds: Sequence[int],
        positions: torch.Tensor,
        *,
        to_host: bool = True,
        allowed: torch.Tensor | None = None,
    ) -> Samples:
        """Row i of `logits` is sampled with params[i], seeds[i] at token position positions[i], among
        the tokens row i of `allowed` (i32 [rows, ceil(V/32)]) allows. With `to_host` False the samples
        stay where the logits are (`SampleCopies` brings them back). When all rows are greedy and none
        asks for log-probabilities (`reads_logprobs`) they are not computed: NaN, top ids -1."""
        rows = self._rows(params, seeds)
        processing = processing_for(rows, self.vocab, reads_logprobs(params))
        graph = self.graphs[sample_graph_name(allowed is not None, processing)]
        args = [logits.float(), *rows, positions.to(torch.int32)]
        args += [] if allowed is None else [allowed]
        # sampling runs where the logits are; host-to-device copies of pageable memory do not wait
        args = [a.to(logits.device, non_blocking=True) for a in args]
        n = logits.shape[0]
        out = self._run(graph, n, {"outs": n}, args)
        s = Samples(*(out[k] for k in ("token", "logprob", "top_logprobs", "top_ids")))
        # the small results come back to the host (detokenization, scheduling)
        return _to_host(s) if to_host else s

    def _run(self, graph: Graph, key: Any, sizes: dict[str, int], args: list[Any]) -> dict[str, torch.Tensor]:
        """`graph` specialized to `sizes` (lowered once per key) run on the logits' platform."""
        device = args[0].device
        platform = platform_of(device) if self.platform is None else self.platform
        name = platform if isinstance(platform, str) else platform.name
        if (name, device) not in self.runners:
            self.runners[(name, device)] = make_runner(platform, device, replay_table())

        def lowered() -> Program:
            at = (graph.name, name, key)
            if at not in self.programs:
                self.programs[at] = lower(specialize(graph, sizes), platform)
            return self.programs[at]

        inputs = dict(zip(graph.input_names, args, strict=True))
        return self.runners[(name, device)].run((graph.name, key), lowered, {}, inputs)


def _tensors(s: Samples) -> tuple[torch.Tensor, ...]:
    return (s.tokens, s.logprobs, s.top_logprobs, s.top_ids)


def _to_host(s: Samples) -> Samples:
    return Samples(*(t.cpu() for t in _tensors(s)))


@dataclass(frozen=True)
class PendingSamples:
    """A step's samples on their way to the host: `wait()` is the step's one host sync."""

    host: Samples
    ready: Any  # torch.cuda.Event, or None when the samples are on the host already

    def wait(self) -> Samples:
        if self.ready is not None:
            self.ready.synchronize()
        return self.host


class SampleCopies:
    """Brings device samples back with one non-blocking copy per tensor into pinned host buffers and an
    event. Two buffer sets alternate: a step's host samples stay valid while the next step's copy runs
    (they are read before the step after that is sampled)."""

    def __init__(self) -> None:
        self._sets: list[Samples | None] = [None, None]
        self._turn = 0

    def start(self, s: Samples) -> PendingSamples:
        if s.tokens.device.type != "cuda":
            return PendingSamples(_to_host(s), None)
        n = s.tokens.shape[0]
        buffers = self._buffers(s)
        host = Samples(*(b[:n] for b in _tensors(buffers)))
        for dst, src in zip(_tensors(host), _tensors(s), strict=True):
            dst.copy_(src, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return PendingSamples(host, ready)

    def _buffers(self, s: Samples) -> Samples:
        """This turn's pinned buffers, grown to at least the samples' rows."""
        i, self._turn = self._turn, 1 - self._turn
        have = self._sets[i]
        if (
            have is None
            or have.tokens.shape[0] < s.tokens.shape[0]
            or have.top_ids.shape[1:] != s.top_ids.shape[1:]
        ):
            rows = max(s.tokens.shape[0], 0 if have is None else have.tokens.shape[0])
            have = Samples(
                *(torch.empty((rows, *t.shape[1:]), dtype=t.dtype, pin_memory=True) for t in _tensors(s))
            )
            self._sets[i] = have
        return have
