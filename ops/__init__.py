"""The closed op set. Importing this package declares every op (see `dsgraph.graph.op.all_ops`)."""

from dsgraph.graph.op import OpDef, get_op
from dsgraph.ops import core, nn, shape
from dsgraph.ops import mhc, quant, rope  # noqa: F401  (group A1)
from dsgraph.ops import engram, moe  # noqa: F401  (group A2)
from dsgraph.ops import attention, cache  # noqa: F401  (group B)

__all__ = ["core", "nn", "op", "shape"]


class _ByName:
    """`op.rope(...)` is `get_op("rope")(...)`: models refer to ops by their IR name."""

    def __getattr__(self, name: str) -> OpDef:
        return get_op(name)


op = _ByName()
