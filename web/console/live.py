"""Render the console's live fragments, for the pages and the websockets alike.

One fragment, one source: the run page draws its timeline, summary, budget and chart
with the same `{% partialdef %}` blocks that the consumers render here and push. Reads
only; called in a worker thread by the consumers (it queries the database).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.safestring import mark_safe

from budgets import spending as spending_mod
from budgets.selectors import ChainHeadroom, chain_headroom, headroom_for_run, run_chain
from instances.brains import iteration_reserve
from loops import policy, selectors
from loops.memory import Memory
from loops.models import Event, Run
from web import charts
from web.console.display import EventView, RunView, tree_view, usd
from web.console.forms import InterjectForm, ResumeRunForm, fresh_nonce

RUN_TEMPLATE = "loops/run_detail.html"
FLEET_TEMPLATE = "loops/fleet.html"

# A state message is drawn once for every socket of its run (web.console.tail), so its forms
# carry these slots, which each socket fills for its own viewer (`for_viewer`): a CSRF token of
# the viewer's sign-in, and a nonce of its own per form. Random per process: no text can name them.
CSRF_SLOT = f"tether-csrf-{secrets.token_hex(16)}"
NONCE_SLOT = f"tether-nonce-{secrets.token_hex(16)}"


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


@dataclass
class CallRow:
    """One reservation as "Where the money went" draws it."""

    iteration: int
    number: int
    label: str
    model: str
    tokens: str
    reserved: str
    settled: str
    status: str
    paid_by: str
    overdraft: str
    cause: str


@dataclass
class IterationRow:
    number: int
    cost: str
    reserved: str
    count: int
    metered: int
    reported: bool
    hidden: int
    overdraft: str
    calls: list[CallRow]


@dataclass
class SpendingView:
    iterations: list[IterationRow]
    earlier: int | None
    older: bool = False  # a page of older iterations: none of them opens by itself


def _tokens(call: spending_mod.CallCost) -> str:
    if not call.metered and not (call.input_tokens or call.output_tokens):
        return "tokens not metered (reported by the agent)"
    parts = [f"{call.input_tokens:,} in", f"{call.output_tokens:,} out"]
    if call.cache_write_tokens or call.cache_read_tokens:
        parts.append(f"cache {call.cache_write_tokens:,} written, {call.cache_read_tokens:,} read")
    return " · ".join(parts)


def _call_row(call: spending_mod.CallCost) -> CallRow:
    return CallRow(
        iteration=call.iteration,
        number=call.call,
        label=f"call {call.call}" if call.metered else "reported spend",
        model=call.model,
        tokens=_tokens(call),
        reserved=usd(call.reserved),
        settled="held" if call.settled is None else usd(call.settled),
        status=call.status,
        paid_by=" › ".join(p.name for p in call.paid_by),
        overdraft=usd(call.overdraft) if call.overdraft else "",
        cause=call.cause,
    )


def spending_view(found: spending_mod.RunSpending, older: bool = False) -> SpendingView:
    return SpendingView(
        iterations=[
            IterationRow(
                number=it.number,
                cost=usd(it.cost),
                reserved=usd(it.reserved),
                count=it.count,
                metered=it.metered,
                reported=it.count > it.metered,
                hidden=it.hidden,
                overdraft=usd(it.overdraft) if it.overdraft else "",
                calls=[_call_row(c) for c in it.calls],
            )
            for it in found.iterations
        ],
        earlier=found.earlier,
        older=older,
    )


@dataclass
class ChartScope:
    """Which iterations the chart draws: `count` of `total`, first to last; `hidden` ones are left out."""

    first: int
    last: int
    count: int
    total: int
    all: bool

    @property
    def hidden(self) -> int:
        return max(0, self.total - self.count)


def chart_scope(drawn: list[Any], total: int, chart_all: bool) -> ChartScope:
    if not drawn:
        return ChartScope(0, 0, 0, total, chart_all)
    return ChartScope(drawn[0].number, drawn[-1].number, len(drawn), max(total, len(drawn)), chart_all)


# What a running run is doing, by the last of these events it recorded ("Now: iteration 3 — checking").
PHASES = {
    "run.claimed": "starting", "run.resumed": "starting", "iteration.finished": "starting",
    "iteration.started": "acting", "act.started": "acting",
    "act.finished": "checking", "protected.changed": "checking",
    "checks.finished": "deciding", "grade.finished": "deciding", "grade.role": "deciding", "decision.made": "deciding",
}


def now_line(run: Run) -> str:
    """Return the live run's one line at the top of its page ("" once it finished; one query)."""
    view = RunView(run)
    if not view.live:
        return ""
    if run.cancel_requested_at is not None:
        return "Now: stopping"
    if run.status == Run.Status.QUEUED or view.worker_note is not None:
        return "Now: waiting for a worker to pick it up"
    number = view.iteration_number or 1
    if view.waiting_on_children:
        return f"Now: iteration {(run.delegation or {}).get('iteration') or number} — {view.children_word}"
    if view.awaits_person:
        return f"Now: iteration {number} — waiting for your answer"
    last = (
        Event.objects.filter(run_id=run.pk, kind__in=list(PHASES)).order_by("-seq").values_list("kind", flat=True).first()
    )
    return f"Now: iteration {number} — {PHASES.get(last or '', 'starting')}"


def progress_line(run: Run) -> str:
    """The run page's progress line: what the checks said is left, and (while it runs) the forecast; "" if unmeasured."""
    track = Memory.of(run.history).track
    measured = [(number, count) for number, count, _ in track if count is not None]
    if not measured:
        return ""
    number, count = measured[-1]
    line = f"Left to fix by the checks' count: {count} after iteration {number}"
    if len(measured) > 1:
        line += f" (from {measured[0][1]} after iteration {measured[0][0]})"
    if run.status == Run.Status.FINISHED:
        return line + "."
    said = policy.forecast(track, max(run.next_iteration - 1, 0), run.max_iterations, run.spent_micros, run.max_cost_micros)
    return f"{line}. Forecast: {said}."


def run_state_context(run: Run, chart_all: bool = False) -> dict[str, Any]:
    """Return what the run page's summary, budget, money trail and chart blocks draw.

    The chart draws the latest selectors.CHART_ITERATIONS iterations, or every one (up to
    selectors.CHART_ALL_ITERATIONS) when `chart_all`; its caption says which.
    """
    chain = headroom_for_run(run)
    limit = selectors.CHART_ALL_ITERATIONS if chart_all else selectors.CHART_ITERATIONS
    drawn = selectors.chart_iterations(run, limit=limit)
    return {
        "tree": tree_view(run),
        "now": now_line(run),
        "chart_all": chart_all,
        "chart_scope": chart_scope(drawn, run.iterations_done, chart_all),
        "run": RunView(run),
        "pools": budget_rows(chain),
        "headroom": usd(chain.remaining) if chain.pools else None,
        "spending": spending_view(spending_mod.run_spending(run.pk, chain=chain)),
        "costs_url": reverse("api:run-costs", args=[run.instance_id, run.pk]),
        "chart": mark_safe(charts.cost_and_checks(charts.points(drawn), run.iterations_done)),
        "progress_line": progress_line(run),
        "resume": resume_offer(run),
    }


# --- resume with a new cap ---------------------------------------------------------------------------


def _in_dollars(name: str) -> property:
    """A read-only attribute: the amount in micros named `name`, said in dollars (`usd`)."""
    return property(lambda self: usd(getattr(self, name)))


@dataclass
class PoolLeft:
    name: str
    left: str


@dataclass
class ResumeOffer:
    """What the run page offers a budget_exhausted run: "Resume with a cap of $…", and within what.

    All figures are micro-dollars: `used` is what the run spent and holds, `needed` what one
    iteration reserves up front, `most` the highest cap the pools above the run can still grant
    (None: no limit), `least` the lowest cap that lets it begin one more iteration.
    """

    cap: int | None
    used: int
    needed: int
    above: int | None
    tightest: str
    pools: list[PoolLeft]
    form: Any = None
    budget_url: str = ""
    suggested: int | None = field(default=None)

    @property
    def most(self) -> int | None:
        return None if self.above is None else self.used + self.above

    @property
    def least(self) -> int:
        floor = self.used + self.needed
        return max(floor, self.cap + 1) if self.cap is not None else floor

    @property
    def blocked(self) -> str:
        """Why no cap can resume the run (its pools cannot grant one iteration), or ""."""
        if self.above is not None and self.above < self.needed:
            return (
                f"Pool “{self.tightest}” has {usd(self.above)} left, and an iteration reserves "
                f"{usd(self.needed)}: raise that pool's limit first, then resume."
            )
        return ""

    # The amounts as the page says them, in dollars.
    cap_text = _in_dollars("cap")
    needed_text = _in_dollars("needed")
    used_text = _in_dollars("used")
    most_text = _in_dollars("most")
    least_text = _in_dollars("least")

    def refusal(self, cap: int | None) -> str:
        """Why resuming with `cap` (None: the cap it has) would end at once, or "" when it can go on."""
        if self.blocked:
            return self.blocked
        if cap is None:
            if self.cap is not None and self.cap - self.used < self.needed:
                return (
                    f"Its cap of {usd(self.cap)} is spent ({usd(self.used)} used; an iteration reserves "
                    f"{usd(self.needed)}): resuming would stop it again at once. Give a cap of at least "
                    f"{self.least_text}."
                )
            return ""
        if self.cap is not None and cap <= self.cap:
            return f"The new cap must be above its current cap of {usd(self.cap)}."
        if cap - self.used < self.needed:
            return (
                f"A cap of {usd(cap)} leaves {usd(max(0, cap - self.used))} after the {usd(self.used)} this run "
                f"has used, and an iteration reserves {usd(self.needed)}: it would stop again at once. "
                f"Give at least {self.least_text}."
            )
        if self.most is not None and cap > self.most:
            return (
                f"A cap of {usd(cap)} is more than the pools allow: “{self.tightest}” has {usd(self.above)} left, "
                f"so the most is {self.most_text}."
            )
        return ""


def resume_offer(run: Run, form: Any = None) -> ResumeOffer | None:
    """Return what resuming budget_exhausted `run` may ask for (None for any other run)."""
    if run.status != Run.Status.FINISHED or run.outcome != Run.Outcome.BUDGET_EXHAUSTED or run.parent_id:
        return None  # a delegated run is not resumed: its parent decides (the service says so)

    pools = run_chain(run)
    own = next((p for p in pools if p.kind == "run" and p.run_id == run.pk), None)
    above = [p for p in pools if p is not own]
    left, tightest = chain_headroom(above)
    used = own.spent + own.reserved if own is not None else run.spent_micros
    offer = ResumeOffer(
        cap=run.max_cost_micros,
        used=max(0, used),
        needed=max(1, iteration_reserve(run.instance)),
        above=left,
        tightest=tightest.name if tightest is not None else "",
        pools=[
            PoolLeft(row.name, "no limit" if row.remaining is None else usd(max(0, row.remaining)))
            for row in headroom_for_run(run).pools
            if own is None or row.id != own.pk
        ],
        budget_url=reverse("loops:instance-budget", args=[run.instance_id]),
    )
    if offer.cap is not None:  # as much again as it had, within what the pools can grant
        suggested = max(offer.least, 2 * offer.cap)
        if offer.most is not None:
            suggested = min(suggested, offer.most)
        offer.suggested = suggested
    offer.form = form if form is not None else ResumeRunForm(run=run, offer=offer)
    return offer


def render_event(event: Event) -> str:
    """Return the websocket message for one event: its timeline fragment, appended, carrying its seq."""
    return render_to_string(f"{RUN_TEMPLATE}#live-event", {"event": EventView.of(event)})


def render_state(run: Run, chart_all: bool = False) -> str:
    """Return the websocket message that replaces the run page's summary, actions, budget, money trail and chart.

    The actions block carries `data-actions` (what decides which actions it offers): the page keeps
    its own block, with what a person is typing, unless that changed (see static/console/console.js).
    """

    context = {
        **run_state_context(run, chart_all),
        "form": InterjectForm(run=run, initial={"nonce": NONCE_SLOT}),
        "csrf_token": CSRF_SLOT,
        "oob": True,
    }
    return render_to_string(f"{RUN_TEMPLATE}#live-state", context)


def for_viewer(message: str, csrf_token: str) -> str:
    """Fill a state message's slots for one socket: its viewer's CSRF token, and a fresh nonce per form.

    Without a token ("": no CSRF cookie yet) the page's script fills the field from the page's own.
    """

    if CSRF_SLOT in message:
        message = message.replace(CSRF_SLOT, csrf_token)
    while NONCE_SLOT in message:
        message = message.replace(NONCE_SLOT, fresh_nonce(), 1)
    return message


def render_summary(run: Run) -> str:
    """Return the websocket message that replaces the run page's summary alone (a periodic refresh)."""
    context = {"run": RunView(run), "tree": tree_view(run), "now": now_line(run), "oob": True}
    return render_to_string(f"{RUN_TEMPLATE}#run-summary", context)


# --- fleet -----------------------------------------------------------------------------------------


def working_runs(user: Any) -> list[RunView]:
    """Return the user's runs at work, newest first, each child nested under its parent ("Working now").

    At work: queued, running, or a parent waiting for its children (they work for it). A child whose
    parent is not in the list stays at the top level and names its parent (see _run_row.html).
    """
    found = selectors.runs_for(user).filter(
        Q(status__in=[Run.Status.QUEUED, Run.Status.RUNNING]) | Run.parked_on_children()
    )
    views = [RunView(r) for r in found.order_by("-id")[:100]]
    by_id = {view.pk: view for view in views}
    top = []
    for view in reversed(views):  # oldest first: a parent's children in the order they were started
        parent = by_id.get(view.parent_id)
        (parent.nested if parent is not None else top).append(view)
    top.reverse()
    return top


def fleet_context(user: Any) -> dict[str, Any]:
    needs = selectors.needs_you(user)
    working = working_runs(user)
    return {
        "instances": list(selectors.instances_for(user)),
        "active": working,
        "active_count": _count(working),
        "needs": {
            "waiting": [RunView(r) for r in needs.waiting],
            "failed": [RunView(r) for r in needs.failed],
            "unverified": [RunView(r) for r in needs.unverified],
            "count": needs.count,
            "since": needs.since,
        },
    }


def _count(views: list[RunView]) -> int:
    return sum(1 + _count(view.nested) for view in views)


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
