"""Structured output: grammar-constrained decoding through XGrammar (params, compile cache, matchers)."""

from dsgraph.runtime.structured.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
