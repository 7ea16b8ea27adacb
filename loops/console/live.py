"""Render the console's live fragments, for the pages and the websockets alike.

One fragment, one source: the run page draws its timeline, summary, budget and chart
with the same `{% partialdef %}` blocks that the consumers render here and push. Reads
only; called in a worker thread by the consumers (it queries the database).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.template.loader import render_to_string
from django.utils.safestring import mark_safe

from budgets.selectors import ChainHeadroom, headroom_for_run
from loops import charts, selectors
from loops.console.display import EventView, RunView, usd
from loops.models import Event, Run

RUN_TEMPLATE = "loops/run_detail.html"
FLEET_TEMPLATE = "loops/fleet.html"


@dataclass
class PoolRow:
    name: str
    kind: str
    limit: str
    spent: str
    reserved: str
    remaining: str
    used_percent: int  # spent share of the limit, 0-100 (None limit: 0)
    reserved_percent: int
    over_threshold: bool
    overdrawn: bool
    limiting: bool


def budget_rows(chain: ChainHeadroom) -> list[PoolRow]:
    rows = []
    for pool in chain.pools:
        if pool.limit:
            used = min(100, max(0, round(100 * pool.spent / pool.limit)))
            held = min(100 - used, max(0, round(100 * pool.reserved / pool.limit)))
        else:
            used = held = 0
        rows.append(
            PoolRow(
                name=pool.name,
                kind=pool.kind,
                limit=usd(pool.limit),
                spent=usd(pool.spent),
                reserved=usd(pool.reserved),
                remaining=usd(pool.remaining),
                used_percent=used,
                reserved_percent=held,
                over_threshold=pool.over_threshold,
                overdrawn=pool.overdrawn,
                limiting=chain.limiting is not None and chain.limiting.id == pool.id,
            )
        )
    return rows


def run_state_context(run: Run) -> dict[str, Any]:
    """Return what the run page's summary, budget and chart blocks draw."""
    chain = headroom_for_run(run)
    drawn = selectors.chart_iterations(run)
    return {
        "run": RunView(run),
        "pools": budget_rows(chain),
        "headroom": usd(chain.remaining) if chain.pools else None,
        "chart": mark_safe(charts.cost_and_checks(charts.points(drawn), run.iterations_done)),
    }


def render_event(event: Event) -> str:
    """Return the websocket message for one event: its timeline fragment, appended, carrying its seq."""
    return render_to_string(f"{RUN_TEMPLATE}#live-event", {"event": EventView.of(event)})


def render_state(run: Run) -> str:
    """Return the websocket message that replaces the run page's summary, budget and chart."""
    return render_to_string(f"{RUN_TEMPLATE}#live-state", {**run_state_context(run), "oob": True})


# --- fleet -----------------------------------------------------------------------------------------


def fleet_context(user: Any) -> dict[str, Any]:
    needs = selectors.needs_you(user)
    return {
        "instances": list(selectors.instances_for(user)),
        "active": [RunView(r) for r in selectors.active_runs(user)[:100]],
        "needs": {
            "waiting": [RunView(r) for r in needs.waiting],
            "failed": [RunView(r) for r in needs.failed],
            "unverified": [RunView(r) for r in needs.unverified],
            "count": needs.count,
            "since": needs.since,
        },
    }


def render_fleet(user: Any) -> str:
    """Return the websocket message that replaces the fleet page's live blocks."""
    return render_to_string(f"{FLEET_TEMPLATE}#fleet-live", {**fleet_context(user), "oob": True})


# --- history ----------------------------------------------------------------------------------------


@dataclass
class TotalsView:
    runs: int
    iterations: int
    spent: str
    by_outcome: list[tuple[str, int]]


def totals_view(totals: selectors.Totals) -> TotalsView:
    return TotalsView(
        runs=totals.runs,
        iterations=totals.iterations,
        spent=usd(totals.spent_micros),
        by_outcome=[(label.replace("_", " "), n) for label, n in totals.by_outcome],
    )
