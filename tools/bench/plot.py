"""The decode Pareto plot (tokens/s per GPU against tokens/s per request, one curve per context) as a
self-contained SVG, so the bench needs no plotting library on the GPU machine or here. `bench serve`
draws the same plot from its runs (one curve per load setting: total against per-request throughput)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

W, H, PAD = 640, 420, 60
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def _log_axis(values: list[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    return math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + (1 if lo == hi else 0)


def _scale(v: float, axis: tuple[float, float], length: int) -> float:
    lo, hi = axis
    return (math.log10(v) - lo) / max(hi - lo, 1e-9) * length


@dataclass(frozen=True)
class Axes:
    """Which row fields make the curves: `series` groups rows into curves, y = row[per_gpu] and
    x = y / row[count]."""

    series: str = "context"
    count: str = "batch"
    label: Callable[[Any], str] = lambda ctx: f"ctx {ctx // 1024}k"
    x_title: str = "tokens/s per request"
    y_title: str = "tokens/s per GPU"


def _series(rows: list[dict[str, Any]], per_gpu: str, axes: Axes) -> dict[Any, list[tuple[float, float]]]:
    out: dict[Any, list[tuple[float, float]]] = {}
    for r in rows:
        if per_gpu in r and r[per_gpu] > 0:
            out.setdefault(r[axes.series], []).append((r[per_gpu] / r[axes.count], r[per_gpu]))
    return {c: sorted(pts) for c, pts in sorted(out.items(), key=lambda kv: str(kv[0]))}


def _grid(ax: tuple[float, float], ay: tuple[float, float]) -> list[str]:
    parts = []
    for e in range(int(ax[0]), int(ax[1]) + 1):
        x = PAD + _scale(10.0**e, ax, W - 2 * PAD)
        parts.append(f'<line x1="{x:.1f}" y1="{PAD}" x2="{x:.1f}" y2="{H - PAD}" stroke="#ddd"/>')
        parts.append(f'<text x="{x:.1f}" y="{H - PAD + 16}" font-size="11" text-anchor="middle">1e{e}</text>')
    for e in range(int(ay[0]), int(ay[1]) + 1):
        y = H - PAD - _scale(10.0**e, ay, H - 2 * PAD)
        parts.append(f'<line x1="{PAD}" y1="{y:.1f}" x2="{W - PAD}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{PAD - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">1e{e}</text>')
    return parts


def _text(x: float, y: float, body: str, size: int = 11, extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" {extra}>{body}</text>'


def _curve(i: int, label: str, xy: list[tuple[float, float]]) -> list[str]:
    color = COLORS[i % len(COLORS)]
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    return [
        f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{points}"/>',
        *(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>' for x, y in xy),
        _text(W - PAD + 4, PAD + 16 * i, label, extra=f'fill="{color}"'),
    ]


def pareto_svg(rows: list[dict[str, Any]], per_gpu: str, title: str, axes: Axes = Axes()) -> str:
    """`rows`: decode rows with batch, context and the `per_gpu` tokens/s field (or `axes`' fields)."""
    series = _series(rows, per_gpu, axes)
    pts = [p for s in series.values() for p in s]
    head = f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">'
    if not pts:
        return "\n".join([head, _text(10, 30, f"{title}: no data", 14), "</svg>"]) + "\n"
    ax, ay = _log_axis([p[0] for p in pts]), _log_axis([p[1] for p in pts])
    parts = [head, f'<rect width="{W}" height="{H}" fill="white"/>', *_grid(ax, ay)]
    parts.append(_text(W / 2, 24, title, 14, 'text-anchor="middle"'))
    parts.append(_text(W / 2, H - 18, axes.x_title, 12, 'text-anchor="middle"'))
    rot = f'transform="rotate(-90 16 {H / 2})" text-anchor="middle"'
    parts.append(_text(16, H / 2, axes.y_title, 12, rot))
    for i, (ctx, s) in enumerate(series.items()):
        xy = [(PAD + _scale(x, ax, W - 2 * PAD), H - PAD - _scale(y, ay, H - 2 * PAD)) for x, y in s]
        parts += _curve(i, axes.label(ctx), xy)
    return "\n".join([*parts, "</svg>"]) + "\n"
