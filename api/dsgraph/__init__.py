"""dsgraph: a compiled-graph inference engine for DeepSeek-V4.1-Flash.

The offline API in vLLM's shape: `from dsgraph import LLM, SamplingParams`; one model step at a time:
`from dsgraph import EngineConfig, Session` (`Session.from_checkpoint`, docs/session.md). The names are
loaded on first use, so `import dsgraph.tools.cli` (and everything that does not need torch) stays light.
This file is the package's top level (pyproject maps this folder to `dsgraph`); the subpackages are the
repository's top-level folders (`dsgraph.runtime`, `dsgraph.models`, ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsgraph._lazy import lazy_names

if TYPE_CHECKING:
    from dsgraph.runtime.engine import EngineConfig
    from dsgraph.runtime.llm import LLM
    from dsgraph.runtime.outputs import CompletionOutput, Logprob, RequestOutput
    from dsgraph.runtime.sampling_params import RequestError, SamplingParams
    from dsgraph.runtime.session import Session

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "Logprob",
    "RequestError",
    "RequestOutput",
    "SamplingParams",
    "Session",
]

_WHERE = {
    "LLM": "dsgraph.runtime.llm",
    "EngineConfig": "dsgraph.runtime.engine",
    "CompletionOutput": "dsgraph.runtime.outputs",
    "Logprob": "dsgraph.runtime.outputs",
    "RequestOutput": "dsgraph.runtime.outputs",
    "RequestError": "dsgraph.runtime.sampling_params",
    "SamplingParams": "dsgraph.runtime.sampling_params",
    "Session": "dsgraph.runtime.session",
}


__getattr__, __dir__ = lazy_names("dsgraph", _WHERE)
