"""The passes every graph the runtime runs goes through before it is specialized to a bucket."""

from __future__ import annotations

from dsgraph.graph.ir import Graph
from dsgraph.graph.passes.cse import cse
from dsgraph.graph.passes.dce import dce


def optimize(graph: Graph) -> Graph:
    """CSE, then DCE of what it left unused. The model emits one equation per use and leaves sharing to
    CSE: linears that read one activation each emit its act_qdq, and one remains."""
    return dce(cse(graph))
