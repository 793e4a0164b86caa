"""The offline API, in vLLM's shape: `LLM(model=..., **config).generate(prompts, sampling_params)`,
`.chat(messages, sampling_params)` and `.stream(...)`.

A prompt is a string, a list of token ids, `{"prompt": str}` or `{"prompt_token_ids": [...]}`, alone
or in a list. A bad request (empty prompt, unknown token id, prompt over max_model_len, invalid sampling
params, a malformed prompt dict) gets a `RequestOutput` whose `error` names the field; every other
request of the call runs normally.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from dsgraph.runtime.engine import Engine, EngineConfig
from dsgraph.runtime.llm_outputs import request_output
from dsgraph.runtime.outputs import RequestOutput
from dsgraph.runtime.sampling_params import RequestError, SamplingParams, completion_seed

Prompt = str | Sequence[int] | Mapping[str, Any]
Params = SamplingParams | Sequence[SamplingParams] | None
Message = Mapping[str, Any]


@dataclass
class _Request:
    index: int
    prompt: str | None
    prompt_ids: list[int]
    params: SamplingParams
    rids: list[int]  # one engine request per completion (n)
    error: str | None = None


def _is_single(prompts: Prompt | Sequence[Prompt]) -> bool:
    if isinstance(prompts, str | Mapping):
        return True
    return bool(prompts) and isinstance(prompts[0], int) and not isinstance(prompts[0], bool)


def _prompt_fields(item: object) -> tuple[str | None, list[int] | None]:
    """(text, token ids) of one prompt; RequestError names what is wrong with it."""
    if isinstance(item, str):
        return item, None
    if isinstance(item, Mapping):
        unknown = sorted(set(item) - {"prompt", "prompt_token_ids"})
        if unknown:
            raise RequestError(
                unknown[0], item[unknown[0]], "absent: a prompt dict has 'prompt' or 'prompt_token_ids'"
            )
        if ("prompt" in item) == ("prompt_token_ids" in item):
            raise RequestError(
                "prompt", dict(item), "a dict with exactly one of 'prompt', 'prompt_token_ids'"
            )
        if "prompt" in item:
            if not isinstance(item["prompt"], str):
                raise RequestError("prompt", item["prompt"], "a string")
            return item["prompt"], None
        item = item["prompt_token_ids"]
    if isinstance(item, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
        return None, [int(t) for t in item]
    raise RequestError(
        "prompt", item, "a string, a list of token ids, {'prompt': ...} or {'prompt_token_ids': ...}"
    )


def _tokenizer(model_dir: Path) -> Any:
    """The engine's tokenizer of a checkpoint, for a front process that holds no engine."""
    from dsgraph.models.registry import family_for

    family = family_for(model_dir)
    return family.load_tokenizer(Path(model_dir), family.load_config(model_dir))


class LLM:
    def __init__(
        self,
        model: str | Path | None = None,
        *,
        ep: object = 1,
        config: EngineConfig | None = None,
        **options: object,
    ) -> None:
        """`options`: EngineConfig options by their flat names (`max_num_seqs=4`, `speculative="off"`;
        `EngineConfig.from_flat`), applied over `config` (default EngineConfig()). `ep` > 1 (or an
        `EPConfig`): that many rank processes, data-parallel attention and expert-parallel MoE
        (runtime/distributed); `generate` spreads the prompts over them."""
        engine_config = EngineConfig() if config is None else config
        if options:  # a bad option fails here, before any weight is read or rank started
            engine_config = engine_config.with_flat(**options)
        if model is None:
            from dsgraph.tools.generate_cmd import default_model_dir

            model = default_model_dir()
        self.model_dir = Path(model)
        self.group = None
        self._ids = itertools.count()
        self._request_ids = itertools.count()
        self._recipe_tok: Any = None  # deepseek-recipe's tokenizer, loaded by the first chat()
        from dsgraph.runtime.distributed.config import EPConfig

        ep_config = ep if isinstance(ep, EPConfig) else EPConfig(ep=int(ep))  # type: ignore[call-overload]
        if ep_config.ep > 1:
            from dsgraph.runtime.distributed.dp import EPRunner

            self.group = EPRunner(model, ep_config, engine_config.flat())
            self.tokenizer = _tokenizer(self.model_dir)
            return
        self.engine = Engine(model, engine_config)
        self.tokenizer = self.engine.tokenizer

    @classmethod
    def from_engine(cls, engine: Engine) -> LLM:
        """An LLM over an engine built elsewhere (one rank of an expert-parallel group)."""
        llm = cls.__new__(cls)
        llm.model_dir, llm.group, llm.engine, llm.tokenizer = engine.model_dir, None, engine, engine.tokenizer
        llm._ids, llm._request_ids, llm._recipe_tok = itertools.count(), itertools.count(), None
        return llm

    def _requests(self, prompts: Prompt | Sequence[Prompt], params: Params) -> list[_Request]:
        items = [prompts] if _is_single(prompts) else list(prompts)  # type: ignore[arg-type]
        plist = list(params) if isinstance(params, Sequence) else [params or SamplingParams()] * len(items)
        if len(plist) != len(items):
            raise ValueError(f"sampling_params: {len(plist)} given for {len(items)} prompts")
        out = []
        for i, (item, sp) in enumerate(zip(items, plist, strict=True)):
            try:
                text, ids = _prompt_fields(item)
            except RequestError as exc:
                out.append(_Request(i, None, [], sp, [], str(exc)))
                continue
            if ids is None:
                ids = self.tokenizer.encode(text).ids
            out.append(_Request(i, text, ids, sp, []))
        return out

    def _submit(self, req: _Request) -> None:
        if req.error is not None:
            return
        try:
            base = req.params.validate(self.engine.cfg.text.vocab_size).completion_seeds()[0]
            for k in range(req.params.n):
                rid = next(self._ids)
                self.engine.add_request(rid, req.prompt_ids, req.params, seed=completion_seed(base, k))
                req.rids.append(rid)
        except RequestError as exc:
            for rid in req.rids:
                self.engine.abort(rid)
            req.error = str(exc)

    def _output(self, req: _Request, request_id: str) -> RequestOutput:
        lives = [self.engine.live[rid] for rid in req.rids]
        return request_output(
            request_id, req.prompt, req.prompt_ids, req.params, lives, req.error, self.tokenizer
        )

    def stream(
        self, prompts: Prompt | Sequence[Prompt], sampling_params: Params = None
    ) -> Iterator[tuple[int, str, RequestOutput]]:
        """Yield (prompt index, new text, request state so far) after every step that advanced a request."""
        reqs = self._requests(prompts, sampling_params)
        names = {req.index: str(next(self._request_ids)) for req in reqs}
        for req in reqs:
            self._submit(req)
            if req.error is not None:
                yield req.index, "", self._output(req, names[req.index])
        owner = {rid: req for req in reqs for rid in req.rids}
        while self.engine.has_unfinished:
            for event in self.engine.step():
                req = owner[event.rid]
                yield req.index, event.text, self._output(req, names[req.index])

    def generate(
        self, prompts: Prompt | Sequence[Prompt], sampling_params: Params = None, use_tqdm: bool = False
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs in prompt order. `use_tqdm`: a bar of finished
        prompts on stderr (off by default, unlike vLLM: library calls stay quiet)."""
        if self.group is not None:
            return self.group.generate([prompts] if _is_single(prompts) else list(prompts), sampling_params)
        final: dict[int, RequestOutput] = {}
        count = 1 if _is_single(prompts) else len(prompts)  # type: ignore[arg-type]
        with tqdm(total=count, unit="prompt", disable=not use_tqdm) as bar:
            for index, _text, out in self.stream(prompts, sampling_params):
                if out.finished and (index not in final or not final[index].finished):
                    bar.update(1)
                final[index] = out
        return [final[i] for i in sorted(final)]

    def chat(
        self,
        messages: Sequence[Message] | Sequence[Sequence[Message]],
        sampling_params: Params = None,
        *,
        thinking: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of OpenAI-style messages) or a list of them. The
        prompt is rendered by deepseek-recipe exactly as `dsgraph serve` renders /v1/chat/completions;
        `thinking` chooses thinking mode, `tools` are offered as in a request body."""
        from dsgraph.runtime.server.chat_render import render_chat
        from dsgraph.runtime.server.protocol import recipe_tokenizer

        if self._recipe_tok is None:
            self._recipe_tok = recipe_tokenizer(self.model_dir)
        convs = [messages] if messages and isinstance(messages[0], Mapping) else list(messages)
        prompts = [
            {"prompt_token_ids": render_chat(self._recipe_tok, self.tokenizer, list(c), thinking, tools)}
            for c in convs
        ]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)
