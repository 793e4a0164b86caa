"""The prefill cost model: the time to prefill a context of L tokens, t(L) = a + b*L + c*L^2 (the
linear layers are linear in L, attention over the context quadratic), fitted by least squares to
measured (context length, time) pairs with every coefficient kept >= 0. A chunk of n tokens after p
cached ones then costs a + b*n + c*((p+n)^2 - p^2), and the chunk size that fills a time budget is the
positive root of that quadratic."""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class QuadraticCost:
    a: float  # seconds per step (launch, sampling, the fixed part)
    b: float  # seconds per token (weights: GEMMs, MoE)
    c: float  # seconds per token pair (attention over the context)

    def time(self, tokens: float) -> float:
        return self.a + self.b * tokens + self.c * tokens * tokens

    def chunk_time(self, start: int, size: int) -> float:
        """One step prefilling `size` tokens after `start` already in the cache."""
        return self.a + self.b * size + self.c * ((start + size) ** 2 - start**2)

    def chunk_for_budget(self, start: int, remaining: int, budget_s: float, min_chunk: int) -> int:
        """The largest chunk (>= min_chunk, <= remaining) whose step fits `budget_s`."""
        left = budget_s - self.a
        if left <= 0:
            return min(min_chunk, remaining)
        # c*n^2 + (b + 2*c*start)*n - left = 0
        lin = self.b + 2 * self.c * start
        if self.c > 0:
            n = (-lin + math.sqrt(lin * lin + 4 * self.c * left)) / (2 * self.c)
        else:
            n = left / lin if lin > 0 else float(remaining)
        return max(min(min_chunk, remaining), min(remaining, int(n)))

    def as_text(self) -> str:
        return f"t(L) = {self.a:.4g} + {self.b:.4g}*L + {self.c:.4g}*L^2 s"


def fit_quadratic(samples: Iterable[tuple[float, float]]) -> QuadraticCost:
    """Non-negative least squares by enumeration: every subset of the three terms is fitted, and of the
    fits without a negative coefficient the one of least squared error wins (the exact NNLS optimum).
    Errors are relative (rows weighted by 1/time): step times span orders of magnitude, and absolute
    errors would let the longest contexts decide the constant term."""
    pts = np.asarray(list(samples), dtype=np.float64)
    if pts.ndim != 2 or pts.shape[0] < 3:
        raise ValueError(f"fit_quadratic: {len(pts)} samples, need at least 3")
    lengths, times = pts[:, 0], pts[:, 1]
    if (times <= 0).any():
        raise ValueError("fit_quadratic: every time must be > 0")
    design = np.stack([np.ones_like(lengths), lengths, lengths * lengths], axis=1) / times[:, None]
    target = np.ones_like(times)
    best: tuple[float, np.ndarray] | None = None
    for keep in _subsets():
        coef, *_ = np.linalg.lstsq(design[:, keep], target, rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(3)
        full[list(keep)] = coef
        err = float(((design @ full - target) ** 2).sum())
        if best is None or err < best[0]:
            best = (err, full)
    assert best is not None  # the subset with only the constant term has a non-negative mean
    return QuadraticCost(*(float(x) for x in best[1]))


def _subsets() -> list[tuple[int, ...]]:
    return [s for k in (3, 2, 1) for s in itertools.combinations(range(3), k)]


class OnlineCost:
    """The model a router refits as requests report (context length, time to first token)."""

    def __init__(self, prior: QuadraticCost, window: int = 512, refit_every: int = 32) -> None:
        self.model = prior
        self._samples: deque[tuple[float, float]] = deque(maxlen=window)
        self._refit_every, self._since = refit_every, 0

    @property
    def num_samples(self) -> int:
        return len(self._samples)

    def observe(self, tokens: float, seconds: float) -> None:
        if not (seconds > 0 and math.isfinite(seconds)):
            return
        self._samples.append((tokens, seconds))
        self._since += 1
        distinct = len({int(t) for t, _ in self._samples})
        if self._since >= self._refit_every and distinct >= 3:
            self.model, self._since = fit_quadratic(self._samples), 0
