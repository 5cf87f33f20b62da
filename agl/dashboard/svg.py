"""Line charts as inline SVG, drawn on the server: no chart library and no script in the browser."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

#: Colours of the series in order (repeating).
COLOURS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def line_chart(
    title: str, series: dict[str, Sequence[tuple[float, float]]], width: int = 420, height: int = 200
) -> str:
    """An SVG chart of ``series`` (name → (x, y) points, drawn in x order) with its axes' ranges labelled.

    Each series is one ``<path class="series">`` (a single point is drawn as a dot); non-finite values are left out.
    """
    clean = {
        name: sorted((x, y) for x, y in points if math.isfinite(x) and math.isfinite(y))
        for name, points in series.items()
    }
    clean = {name: points for name, points in clean.items() if points}
    left, right, top, bottom = 48, 10, 22, 28
    parts = [
        f'<svg class="chart" role="img" aria-label="{escape(title)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="{left}" y="14" class="title">{escape(title)}</text>',
    ]
    if not clean:
        parts.append(f'<text x="{left}" y="{height // 2}" class="empty">no values</text></svg>')
        return "".join(parts)
    xs = [x for points in clean.values() for x, _ in points]
    ys = [y for points in clean.values() for _, y in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x0 == x1:
        x0, x1 = x0 - 1, x1 + 1
    if y0 == y1:
        y0, y1 = y0 - 1, y1 + 1
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * plot_h

    parts += [
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="frame"/>',
        f'<text x="{left - 4}" y="{top + 4}" class="tick" text-anchor="end">{_fmt(y1)}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" class="tick" text-anchor="end">{_fmt(y0)}</text>',
        f'<text x="{left}" y="{height - 8}" class="tick">{_fmt(x0)}</text>',
        f'<text x="{left + plot_w}" y="{height - 8}" class="tick" text-anchor="end">{_fmt(x1)}</text>',
    ]
    for i, (name, points) in enumerate(clean.items()):
        colour = COLOURS[i % len(COLOURS)]
        d = " ".join(f"{'M' if j == 0 else 'L'}{px(x):.1f},{py(y):.1f}" for j, (x, y) in enumerate(points))
        parts.append(
            f'<path class="series" data-series="{escape(name)}" d="{d}" fill="none" stroke="{colour}" '
            'stroke-width="2"/>'
        )
        for x, y in points:
            parts.append(
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{colour}">'
                f"<title>{escape(name)} @ {_fmt(x)}: {_fmt(y)}</title></circle>"
            )
        if len(clean) > 1:
            parts.append(
                f'<text x="{left + 6 + 110 * i}" y="{top + 14}" class="legend" fill="{colour}">{escape(name)}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)
