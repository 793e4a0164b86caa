"""The closed op set. Importing this package declares every op (see `dsgraph.graph.op.all_ops`)."""

from dsgraph.graph.op import OpDef, get_op

# Importing every op module declares its ops.
from dsgraph.ops import (  # noqa: F401
    attention,
    cache,
    core,
    dspark,
    engram,
    fused,
    mhc,
    moe,
    mtp,
    nn,
    quant,
    rope,
    sampling,
    shape,
    spec_sampling,
    window_compress,
)

__all__ = ["core", "nn", "op", "shape"]


class _ByName:
    """`op.rope(...)` is `get_op("rope")(...)`: models refer to ops by their IR name."""

    def __getattr__(self, name: str) -> OpDef:
        return get_op(name)


op = _ByName()
