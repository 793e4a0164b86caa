"""The offline API: `LLM(model=..., **config).generate(prompts, sampling_params)` and `.stream(...)`.

A bad request (empty prompt, unknown token id, prompt over max_model_len, invalid sampling params) gets
a `RequestOutput` whose `error` names the field; every other request of the call runs normally.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.outputs import CompletionOutput, RequestOutput
from dsgraph.runtime.sampling_params import RequestError, SamplingParams, completion_seed

Prompt = str | Sequence[int]


@dataclass
class _Request:
    index: int
    prompt: str | None
    prompt_ids: list[int]
    params: SamplingParams
    rids: list[int]  # one engine request per completion (n)
    error: str | None = None


class LLM:
    def __init__(self, model: str | Path | None = None, *, ep: object = 1, **config: object) -> None:
        """`ep` > 1 (or an `EPConfig`): that many rank processes, data-parallel attention and
        expert-parallel MoE (runtime/distributed); `generate` spreads the prompts over them."""
        if model is None:
            from dsgraph.tools.generate_cmd import default_model_dir

            model = default_model_dir()
        self.group = None
        from dsgraph.runtime.distributed.config import EPConfig

        ep_config = ep if isinstance(ep, EPConfig) else EPConfig(ep=int(ep))  # type: ignore[call-overload]
        if ep_config.ep > 1:
            from dsgraph.runtime.distributed.dp import EPRunner

            EngineConfig(**config)  # type: ignore[arg-type]  # bad options fail here, before any rank starts
            self.group = EPRunner(model, ep_config, dict(config))
            return
        self.engine = Engine(model, EngineConfig(**config))  # type: ignore[arg-type]
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    @classmethod
    def from_engine(cls, engine: Engine) -> LLM:
        """An LLM over an engine built elsewhere (one rank of an expert-parallel group)."""
        llm = cls.__new__(cls)
        llm.group, llm.engine, llm.tokenizer, llm._ids = None, engine, engine.tokenizer, itertools.count()
        return llm

    def _requests(
        self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams] | None
    ) -> list[_Request]:
        items = (
            [prompts]
            if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int))
            else list(prompts)
        )
        plist = list(params) if isinstance(params, Sequence) else [params or SamplingParams()] * len(items)
        if len(plist) != len(items):
            raise ValueError(f"sampling_params: {len(plist)} given for {len(items)} prompts")
        out = []
        for i, (p, sp) in enumerate(zip(items, plist, strict=True)):
            ids = self.tokenizer.encode(p).ids if isinstance(p, str) else [int(t) for t in p]
            out.append(_Request(i, p if isinstance(p, str) else None, ids, sp, []))
        return out

    def _submit(self, req: _Request) -> None:
        try:
            seeds = req.params.validate(self.engine.cfg.text.vocab_size).completion_seeds()
            base = seeds[0]
            for k in range(req.params.n):
                rid = next(self._ids)
                self.engine.add_request(rid, req.prompt_ids, req.params, seed=completion_seed(base, k))
                req.rids.append(rid)
        except RequestError as exc:
            for rid in req.rids:
                self.engine.abort(rid)
            req.error = str(exc)

    def _output(self, req: _Request) -> RequestOutput:
        if req.error is not None:
            return RequestOutput(str(req.index), req.prompt, tuple(req.prompt_ids), (), error=req.error)
        comps = []
        for k, rid in enumerate(req.rids):
            live = self.engine.live[rid]
            want_lp = req.params.logprobs or req.params.top_logprobs > 0
            comps.append(
                CompletionOutput(
                    k,
                    live.text,
                    tuple(live.tokens),
                    live.finish,
                    tuple(live.logprobs) if want_lp else None,
                    tuple(tuple(t) for t in live.top) if req.params.top_logprobs else None,
                    num_draft_tokens=live.num_draft_tokens,
                    num_accepted_tokens=live.num_accepted_tokens,
                )
            )
        prompt_lp = None
        first = self.engine.live[req.rids[0]]
        if req.params.prompt_logprobs:
            # positions served from the prefix cache were not recomputed: their logprob is None
            prompt_lp = tuple(first.prompt_logprobs.get(i) for i in range(len(req.prompt_ids)))
        error = next((self.engine.live[rid].error for rid in req.rids if self.engine.live[rid].error), None)
        return RequestOutput(
            str(req.index),
            req.prompt,
            tuple(req.prompt_ids),
            tuple(comps),
            prompt_lp,
            error,
            first.num_cached_tokens or 0,
        )

    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> Iterator[tuple[int, str, RequestOutput]]:
        """Yield (prompt index, new text, request state so far) after every step that advanced a request."""
        reqs = self._requests(prompts, sampling_params)
        for req in reqs:
            self._submit(req)
            if req.error is not None:
                yield req.index, "", self._output(req)
        owner = {rid: req for req in reqs for rid in req.rids}
        while self.engine.has_unfinished:
            for event in self.engine.step():
                req = owner[event.rid]
                yield req.index, event.text, self._output(req)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs in prompt order."""
        if self.group is not None:
            single = isinstance(prompts, str) or (bool(prompts) and isinstance(prompts[0], int))
            return self.group.generate([prompts] if single else list(prompts), sampling_params)
        final: dict[int, RequestOutput] = {}
        for index, _text, out in self.stream(prompts, sampling_params):
            final[index] = out
        return [final[i] for i in sorted(final)]
