"""Grammar compilation off the engine's thread: XGrammar compiles on a worker pool, one compile per
distinct constraint (`StructuredOutputsParams.key`), kept in an LRU cache of futures; a request whose
grammar is still compiling waits without holding up anyone else's steps (runtime/structured/state.py).

XGrammar needs the tokenizer's vocabulary (`vocabulary`: XGrammar's TokenizerInfo from the checkpoint's
`tokenizers` tokenizer, its byte-level/byte-fallback/raw decoding detected from the tokenizer) padded to
the model's vocabulary; tokens past the tokenizer's are never allowed.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from dsgraph.runtime.sampling_params import RequestError
from dsgraph.runtime.structured.params import StructuredOutputsParams

__all__ = ["CompileConfig", "GrammarCache", "GrammarError", "vocabulary"]


class GrammarError(RequestError):
    """A constraint XGrammar cannot compile (or did not compile in time); names the field."""


@dataclass(frozen=True)
class CompileConfig:
    """workers: compile threads; timeout_s: how long a request may wait for its grammar before it is
    refused (the compile itself goes on and is cached); cache_size: compiled grammars kept."""

    workers: int = 2
    timeout_s: float = 30.0
    cache_size: int = 256

    def __post_init__(self) -> None:
        for name in ("workers", "cache_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: {value!r}, expected an integer >= 1")
        if not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            raise ValueError(f"timeout_s: {self.timeout_s!r}, expected a number > 0")


def vocabulary(tokenizer: Tokenizer, vocab_size: int, stop_token_ids: list[int]) -> Any:
    """XGrammar's TokenizerInfo of a `tokenizers` tokenizer, padded to the model's `vocab_size`."""
    import xgrammar as xg
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    return xg.TokenizerInfo.from_huggingface(fast, vocab_size=vocab_size, stop_token_ids=stop_token_ids)


class GrammarCache:
    """Compiled grammars by constraint; `submit` is thread-safe (the server's handlers and the engine
    thread both call it) and never blocks on a compile."""

    def __init__(self, tokenizer_info: Any, config: CompileConfig = CompileConfig()) -> None:
        import xgrammar as xg

        self.info, self.config = tokenizer_info, config
        self.compiler = xg.GrammarCompiler(tokenizer_info, max_threads=config.workers, cache_enabled=False)
        self.pool = cf.ThreadPoolExecutor(config.workers, thread_name_prefix="dsgraph-grammar")
        self._lock = threading.Lock()
        self._futures: OrderedDict[tuple[str, str, bool], cf.Future[Any]] = OrderedDict()
        self.compiles = 0  # distinct constraints compiled (cache misses)

    def submit(self, params: StructuredOutputsParams) -> cf.Future[Any]:
        """The future of `params`' compiled grammar (shared by every request with the same key). Its
        exception is a GrammarError naming the field."""
        key = params.validate().key()
        with self._lock:
            future = self._futures.get(key)
            if future is not None:
                self._futures.move_to_end(key)
                return future
            future = self.pool.submit(self._compile, key)
            self._futures[key] = future
            self.compiles += 1
            while len(self._futures) > self.config.cache_size:
                self._futures.popitem(last=False)
        return future

    def wait(self, params: StructuredOutputsParams) -> Any:
        """Block until `params`' grammar is compiled (at most timeout_s); GrammarError otherwise."""
        return result(self.submit(params), params, self.config.timeout_s)

    def _compile(self, key: tuple[str, str, bool]) -> Any:
        kind, text, compact = key
        try:
            return self._compile_kind(kind, text, compact)
        except Exception as exc:  # XGrammar reports bad schemas/regexes/grammars as RuntimeError etc.
            raise GrammarError(f"structured_outputs.{kind}", _short(text), f"compilable: {exc}") from exc

    def _compile_kind(self, kind: str, text: str, compact: bool) -> Any:
        c = self.compiler
        if kind == "json":
            return c.compile_grammar(_json_grammar(text, compact, strict=True))
        if kind == "json_object":  # any JSON object (additional properties allowed)
            return c.compile_grammar(_json_grammar('{"type": "object"}', compact, strict=False))
        if kind == "regex":
            return c.compile_regex(text)
        if kind == "grammar":
            return c.compile_grammar(text)
        if kind == "choice":
            options = json.loads(text)
            return c.compile_grammar(
                "root ::= " + " | ".join(json.dumps(o, ensure_ascii=False) for o in options)
            )
        import xgrammar as xg

        return c.compile_structural_tag(xg.StructuralTag.from_json(text))


# XGrammar's string rule for length-bounded strings lets raw control characters through, which JSON
# forbids (RFC 8259 section 7); its unbounded strings exclude them. Bounded strings get the same class.
_LOOSE_CHARS = '[^\\"\\\\\\r\\n]'
_JSON_CHARS = '[^\\0-\\x1f\\"\\\\\\r\\n]'


def _json_grammar(schema: str, compact: bool, strict: bool) -> Any:
    """A JSON Schema's grammar (EBNF), its strings free of raw control characters."""
    import xgrammar as xg

    grammar = xg.Grammar.from_json_schema(schema, any_whitespace=not compact, strict_mode=strict)
    return str(grammar).replace(_LOOSE_CHARS, _JSON_CHARS)


def result(future: cf.Future[Any], params: StructuredOutputsParams, timeout_s: float) -> Any:
    """A compile future's grammar within `timeout_s`; GrammarError naming the field otherwise."""
    try:
        return future.result(timeout=timeout_s)
    except cf.TimeoutError as exc:
        kind = params.kind
        raise GrammarError(
            f"structured_outputs.{kind}", _short(params.key()[1]), f"compiled within {timeout_s} s"
        ) from exc


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
