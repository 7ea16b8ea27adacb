"""Server-side SVG charts for the run page. Pure: data in, markup out; no Django, no I/O.

`cost_and_checks` draws one column per iteration: a bar of its cost (scaled to the
dearest iteration shown) and, under it, one square for its checks (all required
passed, a required one failed, only optional ones failed, or no checks). Over the bars, the
progress line: what the checks' own output said was left to fix after each iteration
(`loops.progress`), scaled to the most shown, a dot per measured iteration. The SVG scales
to its container's width; every column carries a <title> for a tooltip and the whole
chart an aria-label that says the same in words.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from budgets.money import format_usd
from loops.progress import total as progress_total

WIDTH = 360
HEIGHT = 150
LEFT = 54
RIGHT = 6
TOP = 14
BAR_BOTTOM = 104
MARK_TOP = 112
MARK_SIZE = 9


@dataclass(frozen=True)
class Point:
    iteration: int
    cost_micros: int
    checks: str  # "passed" | "failed" | "optional" | "none"
    act_ok: bool
    verdict: str
    progress: int | None = None  # what the checks said was left to fix; None: not measured


def checks_state(checks: Sequence[Mapping[str, Any]]) -> str:
    """Return "none", "passed", "failed" (a required check failed) or "optional" (only optional ones failed)."""
    if not checks:
        return "none"
    if any(c.get("required", True) and not c.get("passed") for c in checks):
        return "failed"
    if any(not c.get("passed") for c in checks):
        return "optional"
    return "passed"


def points(iterations: Iterable[Any]) -> list[Point]:
    """Turn iteration rows (number, cost_micros, checks, act_ok, decision) into chart points."""
    return [
        Point(
            iteration=it.number,
            cost_micros=int(it.cost_micros or 0),
            checks=checks_state(list(it.checks or [])),
            act_ok=bool(it.act_ok),
            verdict=str((it.decision or {}).get("verdict", "")),
            progress=progress_total(c.get("progress") for c in it.checks or [] if isinstance(c, Mapping)),
        )
        for it in iterations
    ]


def usd(micros: int) -> str:
    """Return a dollar label: $0, $0.004213, $1.25 (exact, like every amount Tether shows)."""
    return "$0" if micros == 0 else format_usd(micros)


CHECK_WORDS = {
    "passed": "checks passed",
    "failed": "a required check failed",
    "optional": "an optional check failed",
    "none": "no checks",
}


def cost_and_checks(data: Sequence[Point], total_iterations: int | None = None) -> str:
    """Return an SVG of cost and check results per iteration (the latest ones given)."""
    if not data:
        return (
            f'<svg class="chart" viewBox="0 0 {WIDTH} 40" role="img" aria-label="No iterations yet">'
            f'<text x="{WIDTH / 2}" y="24" text-anchor="middle" class="chart-note">No iterations yet</text></svg>'
        )
    dearest = max(p.cost_micros for p in data)
    span = WIDTH - LEFT - RIGHT
    slot = span / len(data)
    bar = max(1.0, min(24.0, slot * 0.7))
    mark = max(2.0, min(MARK_SIZE, slot * 0.8))
    height = BAR_BOTTOM - TOP
    failed = sum(1 for p in data if p.checks == "failed")
    shown = f"iterations {data[0].iteration}–{data[-1].iteration}"
    if total_iterations and total_iterations > len(data):
        shown += f" (latest {len(data)} of {total_iterations})"
    label = (
        f"Cost and checks per iteration, {shown}: dearest {usd(dearest)}, "
        f"total {usd(sum(p.cost_micros for p in data))}; a required check failed in {failed} of {len(data)}."
    )
    measured = [(i, p) for i, p in enumerate(data) if p.progress is not None]
    if measured:
        label += (
            f" Left to fix by the checks' count: {measured[0][1].progress} after iteration {measured[0][1].iteration}, "
            f"{measured[-1][1].progress} after iteration {measured[-1][1].iteration}."
        )
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(label)}">',
        f'<text x="{LEFT - 4}" y="{TOP + 4}" text-anchor="end" class="chart-axis">{escape(usd(dearest))}</text>',
        f'<text x="{LEFT - 4}" y="{BAR_BOTTOM}" text-anchor="end" class="chart-axis">$0</text>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{WIDTH - RIGHT}" y2="{TOP}" class="chart-grid"/>',
        f'<line x1="{LEFT}" y1="{BAR_BOTTOM}" x2="{WIDTH - RIGHT}" y2="{BAR_BOTTOM}" class="chart-base"/>',
        f'<text x="{LEFT - 4}" y="{MARK_TOP + mark}" text-anchor="end" class="chart-axis">checks</text>',
    ]
    for i, p in enumerate(data):
        centre = LEFT + slot * i + slot / 2
        h = 0.0 if dearest == 0 else max(1.0 if p.cost_micros else 0.0, height * p.cost_micros / dearest)
        title = (
            f"Iteration {p.iteration}: {usd(p.cost_micros)}, {CHECK_WORDS[p.checks]}"
            + ("" if p.act_ok else ", the act failed")
            + (f", decision {p.verdict}" if p.verdict else "")
        )
        parts.append(f'<g class="chart-col"><title>{escape(title)}</title>')
        parts.append(
            f'<rect x="{centre - bar / 2:.2f}" y="{BAR_BOTTOM - h:.2f}" width="{bar:.2f}" height="{h:.2f}" '
            f'class="chart-bar{"" if p.act_ok else " chart-bar-failed"}"/>'
        )
        parts.append(
            f'<rect x="{centre - mark / 2:.2f}" y="{MARK_TOP}" width="{mark:.2f}" height="{mark:.2f}" '
            f'class="chart-check chart-check-{p.checks}"/>'
        )
        parts.append("</g>")
    if measured:
        parts.append(_progress_line(measured, slot, height))
    y = MARK_TOP + MARK_SIZE + 16
    parts.append(f'<text x="{LEFT}" y="{y}" class="chart-axis">{data[0].iteration}</text>')
    if len(data) > 1:
        parts.append(
            f'<text x="{WIDTH - RIGHT}" y="{y}" text-anchor="end" class="chart-axis">{data[-1].iteration}</text>'
        )
    parts.append(
        f'<text x="{LEFT + span / 2}" y="{y}" text-anchor="middle" class="chart-axis">iteration</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def _progress_line(measured: Sequence[tuple[int, Point]], slot: float, height: int) -> str:
    """The progress line: what was left after each measured iteration, scaled to the most shown."""
    most = max(p.progress or 0 for _, p in measured)
    spots = [
        (LEFT + slot * i + slot / 2, BAR_BOTTOM - (0 if most == 0 else height * (p.progress or 0) / most), p)
        for i, p in measured
    ]
    line = " ".join(f"{x:.2f},{y:.2f}" for x, y, _ in spots)
    parts = [f'<g class="chart-progress"><polyline points="{line}" class="chart-progress-line"/>']
    for x, y, p in spots:
        title = f"Iteration {p.iteration}: {p.progress} left by the checks' count"
        parts.append(
            f'<circle cx="{x:.2f}" cy="{y:.2f}" r="2.5" class="chart-progress-dot"><title>{escape(title)}</title></circle>'
        )
    parts.append(f'<text x="{WIDTH - RIGHT}" y="{TOP - 3}" text-anchor="end" class="chart-axis">{most} left</text></g>')
    return "".join(parts)
