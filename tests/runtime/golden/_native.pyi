"""
dsgraph's C++ runtime: bucket table now; scheduler and cache managers later.
"""

from collections.abc import Sequence
from typing import Annotated

import numpy
from numpy.typing import NDArray


def version() -> str:
    """The dsgraph package version this module was built for."""

class BucketTable:
    """Padded step sizes; a step of n rows runs in the smallest bucket >= n."""

    def __init__(self, sizes: Sequence[int]) -> None:
        """
        Build from positive, strictly increasing sizes (each at most 2**31 - 1).
        """

    @property
    def sizes(self) -> list[int]:
        """The bucket sizes, ascending."""

    def choose(self, n: int) -> int:
        """
        Smallest bucket >= n; ValueError when n <= 0 or n exceeds the largest bucket.
        """

    def choose_many(self, counts: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> Annotated[NDArray[numpy.int32], dict(shape=(None,))]:
        """
        choose() of every entry of a contiguous int32 CPU array, without the GIL; ValueError names the first bad entry's index.
        """

def pad_rows(n: int, bucket: int) -> int:
    """
    Padding rows that fill a bucket holding n real rows; ValueError unless 0 <= n <= bucket.
    """
