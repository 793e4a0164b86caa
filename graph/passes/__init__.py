"""Graph-to-graph passes. Each returns a new Graph; the verifier holds after every one."""

from dsgraph.graph.passes.cse import cse
from dsgraph.graph.passes.dce import dce
from dsgraph.graph.passes.memory import MemoryPlan, plan_memory
from dsgraph.graph.passes.optimize import optimize
from dsgraph.graph.passes.specialize import specialize

__all__ = ["MemoryPlan", "cse", "dce", "optimize", "plan_memory", "specialize"]
