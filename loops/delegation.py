"""Delegation: the child runs a parent's `delegate` calls start, and the parent's return.

An act that ends with `delegate` calls hands them here. Each call becomes a child run of the
same owner (`services.run_start(parent=...)`): on an instance the owner has, or on a new
instance made from a template (inheriting the parent's credential), with a cap carved from
the parent's headroom (`budgets.ledger.carve`): the cap is held in the parent's chain while
the child runs, and is the child's own pool, the only one its calls reserve in. When the
child finishes, in that same transaction, `refund_carve` books what it spent in the parent's
chain and gives the rest back; so the whole tree can never spend past the root run's cap.
Bounds (`TETHER_DELEGATION_MAX_DEPTH`, `_MAX_CHILDREN`, `_MAX_RUNS`), a cap that does not
fit and any argument the model got wrong (a budget that is not an amount of dollars, an
iteration count out of range) come back as errors the model reads, with no run created; so does
a call that fails inside Tether (logged), and the act's other calls still start.

The parent then waits (status `waiting`, "children running", no lease, no worker): when the
last child started in that act finishes — on any worker, after any crash (the reaper checks
too) — `resume_parent` folds each child's outcome, verified flag, detail, answer excerpt,
spend and (for `copy`) the patch of its workspace into the parent's next instruction
(`loops.delegation_results`) and schedules its next iteration.

Writes runs, instances (template targets), workspaces (`copy`), events; called by the runner
(after an act, outside its iteration transaction) and on every run's finish.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from budgets import ledger, money
from budgets import selectors as budget_selectors
from budgets.models import Pool
from instances import pinned, sandbox
from instances.brains.base import DelegateRefused, Usage
from instances.models import AgentTemplate, Instance
from instances.templates_loader import TemplateError, create_instance
from instances.tools import mcp
from loops import events, policy, schemas, tasks
from loops.delegation_results import render_results, results_key, resume_instruction
from loops.memory import Memory
from loops.models import Run
from tether import dbfaults

log = logging.getLogger(__name__)


class Refusal(DelegateRefused):
    """A delegate call that cannot be honoured; the message is for the model."""


def _tree(run: Run) -> tuple[Run, int]:
    """Return the tree's root run and how many runs the tree has."""
    root = run
    while root.parent_id is not None:
        root = Run.objects.get(pk=root.parent_id)
    size, frontier = 1, [root.pk]
    while frontier:
        frontier = list(Run.objects.filter(parent_id__in=frontier).values_list("pk", flat=True))
        size += len(frontier)
    return root, size


def arguments_of(arguments: Any) -> Any:
    """Return a delegate call's arguments validated by the one schema every surface uses; raise Refusal.

    `loops.schemas.DelegateIn` holds a run's rules (`RunIn`'s objective, cap and iteration count),
    so the model gets the sentence a person gets from the REST API for the same value.
    """
    try:
        return schemas.checked(schemas.DelegateIn, arguments)
    except schemas.Invalid as exc:
        raise Refusal(exc.message) from None


def _budget(arguments: Any) -> Decimal:
    """Return the call's `max_cost_usd` in dollars (to the micro-dollar), or refuse it."""
    budget = arguments_of(arguments).max_cost_usd
    assert budget is not None  # required by the schema
    return Decimal(budget)


def _resolve(run: Run, to: str, mode: str) -> tuple[Any, Any]:
    """Return what `to` names for `run`'s owner: (an instance, None) or (None, a template); create nothing."""
    owner = run.owner
    named = list(Instance.objects.filter(owner=owner, name=to).order_by("pk")[:2])
    if len(named) > 1:  # names are unique per owner when saved; older ones may not be: never guess
        raise Refusal(
            f"{to!r} names more than one of your instances (ids {named[0].pk}, {named[1].pk}, …): "
            "delegate to one by its id, or rename them apart"
        )
    found = named[0] if named else None
    if found is None and to.isdigit() and len(to) <= 18:
        found = Instance.objects.filter(owner=owner, pk=int(to)).first()
    roles = (run.instance.template.roles or {}) if run.instance.template_id else {}
    if found is not None:
        if mode != "own":
            raise Refusal(
                f"workspace {mode!r} needs a template target (a new instance); instance {found.name!r} "
                "has its own workspace: use workspace 'own'"
            )
        _within_grants(run.instance, found, found.name)
        return found, None
    template = AgentTemplate.objects.filter(name=roles.get(to, to)).first()
    if template is None:
        names = ", ".join(Instance.objects.filter(owner=owner).values_list("name", flat=True)[:20]) or "none"
        templates = ", ".join(AgentTemplate.objects.values_list("name", flat=True)) or "none"
        raise Refusal(f"no instance or template named {to!r} (your instances: {names}; templates: {templates})")
    if to not in roles:  # a role the parent's template declares was composed so by the operator
        _within_grants(run.instance, template, f"template {template.name}")
    return None, template


def _within_grants(parent: Any, child: Any, name: str) -> None:
    """Refuse a child that could reach what its parent cannot: network, MCP servers or tools it lacks.

    Delegation is never a way around a grant: an agent without the network, a server, a tool
    (`run_command`, `write_file`, ...) or the freedom to call one without asking a person must
    not get it by handing the work to an instance or template that has it. (A role the parent's
    own template declares was composed so by the operator: `_resolve` does not ask.)
    """
    refused = f": a delegate cannot reach more than you can ({name} is not a role of your template)"
    if getattr(child, "network", False) and not parent.network:
        raise Refusal(f"{name} has network egress and you do not" + refused)
    extra = sorted(set(getattr(child, "mcp_servers", None) or []) - set(parent.mcp_servers or []))
    if extra:
        raise Refusal(f"{name} uses MCP servers you do not ({', '.join(map(str, extra))})" + refused)
    theirs, ours = _tool_names(child), _tool_names(parent)
    builtin = {t for t in theirs if not mcp.is_mcp_name(t)}
    if missing := sorted(builtin - ours):
        raise Refusal(f"{name} has tools you do not ({', '.join(missing)})" + refused)
    their_gates, our_gates = set(getattr(child, "approval_tools", None) or []), set(parent.approval_tools or [])
    if ungated := sorted(t for t in builtin & our_gates if t not in their_gates):
        raise Refusal(
            f"{name} may call {', '.join(ungated)} without a person's approval, and you must ask for it" + refused
        )
    for server in sorted(set(getattr(child, "mcp_servers", None) or [])):
        our_patterns = [t for t in ours if _server_of(t) == server]
        their_patterns = [t for t in theirs if _server_of(t) == server]
        wider = [t for t in their_patterns if not any(_covers(p, t) for p in our_patterns)] if our_patterns else []
        if our_patterns and (not their_patterns or wider):
            shown = ", ".join(wider) or f"every tool of {server}"
            raise Refusal(f"{name} may call MCP tools you may not ({shown})" + refused)
        gates = sorted(g for g in our_gates if _server_of(g) == server and g not in their_gates)
        if gates:
            raise Refusal(f"{name} may call {', '.join(gates)} without a person's approval, and you must ask for it" + refused)
    if "run_command" in builtin:
        allow, deny = list(parent.command_allow or []), set(parent.command_deny or [])
        their_allow = list(getattr(child, "command_allow", None) or [])
        if allow and (not their_allow or not set(their_allow) <= set(allow)):
            raise Refusal(f"{name} may run commands outside your allow list ({', '.join(allow)})" + refused)
        if lifted := sorted(deny - set(getattr(child, "command_deny", None) or [])):
            raise Refusal(f"{name} may run commands your deny list refuses ({', '.join(lifted)})" + refused)


def _tool_names(config: Any) -> set[str]:
    return {str(t) for t in (getattr(config, "tools", None) or []) if isinstance(t, str)}


def _server_of(name: str) -> str | None:
    try:
        return mcp.split(name)[0]
    except ValueError:
        return None


def _covers(ours: str, theirs: str) -> bool:
    """Whether our MCP tool pattern allows every tool `theirs` allows (a name, or a trailing `*` glob)."""
    if ours == theirs:
        return True
    stem = ours[:-1]
    return ours.endswith("*") and not any(c in stem for c in "*?[]!") and theirs.startswith(stem)


def _target(run: Run, to: str, mode: str, number: int) -> Any:
    """Return the instance the child runs on: one the owner has, or a new one from a template."""
    found, template = _resolve(run, to, mode)
    if found is not None:
        return found
    overrides: dict[str, Any] = {}
    if run.instance.credential_id:
        overrides["credential_id"] = run.instance.credential_id
    if mode == "shared":
        overrides["workspace"] = str(run.instance.workspace_path())
    try:
        child = create_instance(
            owner=run.owner, template=template, name=f"{run.instance.name} › {to} (run {run.pk}.{number})"[:100],
            overrides=overrides,
        )
    except TemplateError as exc:
        raise Refusal(str(exc)) from None
    if mode == "copy":
        source, target = run.instance.workspace_path(), child.workspace_path()
        shutil.rmtree(target, ignore_errors=True)  # a new instance starts from the copy alone
        target.mkdir(parents=True)
        try:  # through both held open: what the parent's agent swaps meanwhile is not followed
            with pinned.Pinned(sandbox.checked_workspace(source)) as ours, pinned.Pinned(target.resolve()) as theirs:
                pinned.copy_tree(ours, theirs)
        except (sandbox.WorkspaceRefused, OSError) as exc:
            raise Refusal(f"your workspace could not be copied for the child: {exc}") from None
    return child


@dataclass(frozen=True)
class Vetted:
    """A delegate call that passed every bound: what its child run will be given."""

    to: str
    objective: str
    mode: str
    budget: Decimal
    iterations: int | None

    def as_input(self) -> dict[str, Any]:
        """The call's arguments as they are kept on the run (and vetted again when its child starts)."""
        kept: dict[str, Any] = {
            "to": self.to, "objective": self.objective, "max_cost_usd": str(self.budget), "workspace": self.mode,
        }
        if self.iterations is not None:
            kept["max_iterations"] = self.iterations
        return kept


def vet(run: Run, arguments: dict[str, Any], *, number: int, size: int, carved: Decimal) -> Vetted:
    """Check one delegate call against the bounds, its arguments and the headroom; raise Refusal.

    `number`: its place among this act's calls; `size`: how many runs the tree has (with the
    children this act already asked for); `carved`: what this act's earlier calls carved
    (and still not held: an act's calls are vetted before any child starts). The ledger has
    the last word when the child's carve is reserved (`start_children`).
    """
    if run.depth + 1 > settings.TETHER_DELEGATION_MAX_DEPTH:
        raise Refusal(
            f"delegation is {run.depth + 1} levels deep, past the limit of "
            f"{settings.TETHER_DELEGATION_MAX_DEPTH}: do this part yourself"
        )
    if number > settings.TETHER_DELEGATION_MAX_CHILDREN:
        raise Refusal(f"at most {settings.TETHER_DELEGATION_MAX_CHILDREN} children per act")
    if size >= settings.TETHER_DELEGATION_MAX_RUNS:
        raise Refusal(f"this tree of runs already has {size}, the limit")
    checked = arguments_of(arguments)
    to, objective, mode = checked.to.strip(), checked.objective.strip(), checked.workspace or "own"
    assert checked.max_cost_usd is not None  # required by the schema
    budget = Decimal(checked.max_cost_usd)
    headroom = budget_selectors.headroom_for_run(run).remaining
    if headroom is not None and money.usd_to_micros(carved + budget) > headroom:
        left = max(headroom - money.usd_to_micros(carved), 0)
        raise Refusal(
            f"a {money.format_usd(money.usd_to_micros(budget))} budget does not fit: "
            f"{money.format_usd(left)} of yours is left to carve"
        )
    iterations = checked.max_iterations
    return Vetted(to, objective, mode, budget, iterations)


def check_call(run: Run, arguments: dict[str, Any], earlier: list[dict[str, Any]]) -> Vetted:
    """Vet a delegate call made during an act (through MCP), after the act's `earlier` accepted calls.

    Nothing is created: the children start when the act ends (`start_pending`), where each
    call is vetted again against the tree as it stands then.
    """
    from loops import services  # lazy: loops.services imports this module

    carved = sum((_budget(call["input"]) for call in earlier), Decimal(0))
    _, size = _tree(run)
    vetted = vet(run, arguments, number=len(earlier) + 1, size=size + len(earlier), carved=carved)
    found, template = _resolve(run, vetted.to, vetted.mode)
    try:  # the target's own objective cap, as `run_start` will ask of it
        services._checked_objective(found if found is not None else template, vetted.objective)
    except services.Refused as exc:
        raise Refusal(exc.message) from None
    return vetted


def check_in_act(run_id: int, arguments: Any, earlier: list[dict[str, Any]]) -> dict[str, Any]:
    """For a brain's act: vet one `delegate` call at once; return the input to keep, or raise Refusal.

    `earlier`: the act's calls accepted so far (as this returned them). The Claude brain calls this
    (through `instances.brains.base.check_delegate`) so that a refusal is the tool_result of that
    very call; the children still start when the act ends, vetted again then (`start_pending`).
    """
    def once() -> dict[str, Any]:
        run = Run.objects.select_related("instance", "instance__template", "owner").filter(pk=run_id).first()
        if run is None or run.status != Run.Status.RUNNING:
            raise Refusal("your run is not running: no child run can start from it")
        return check_call(run, arguments, earlier).as_input()

    return dbfaults.retry(once, what=f"run {run_id}: vetting a delegate call")


def start_children(run: Run, iteration: int, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Start a child run for each `delegate` call; return one result per call (`child` or `error`).

    Each call is started in a savepoint of its own: one that is refused, or fails inside Tether,
    leaves nothing behind and gets an `error` the model reads, and the other calls go on. A
    transient database error is raised (the whole start is tried again: `start_pending`).
    """
    from loops import services  # lazy: loops.services imports this module

    results: list[dict[str, Any]] = []
    _, size = _tree(run)
    started = 0
    for number, call in enumerate(calls, start=1):
        arguments = call.get("input") if isinstance(call.get("input"), dict) else {}
        entry: dict[str, Any] = {"id": call.get("id", ""), "to": str(arguments.get("to", ""))[:100]}
        try:
            with transaction.atomic():
                # The children started so far hold their carves already: the headroom shows them.
                vetted = vet(run, arguments, number=number, size=size + started, carved=Decimal(0))
                instance = _target(run, vetted.to, vetted.mode, number)
                child = services.run_start(
                    instance=instance, user=run.owner, objective=vetted.objective, max_iterations=vetted.iterations,
                    max_cost_usd=str(vetted.budget), via="system", parent=run,
                    delegation={"call": entry["id"], "iteration": iteration, "workspace": vetted.mode},
                )
        except (Refusal, services.Refused) as exc:
            entry["error"] = str(exc)
        except Exception as exc:
            if dbfaults.is_transient(exc):
                raise
            log.exception("run %s: delegate call %s failed to start a child run", run.pk, entry["id"])
            entry["error"] = (
                f"Tether failed to start this child run ({type(exc).__name__}; the details are in its log): "
                "do this part yourself, or delegate it again"
            )
        else:
            entry["child"] = child.pk
            started += 1
        results.append(entry)
    return results


def refund_carve(run_id: int) -> None:
    """Give a finished child run's carve back to its parent's chain, less what the child spent (once).

    Called by `lifecycle.after_finish` inside the transaction that finishes the run, whatever
    the outcome (a stop's cascade included): the finish and the refund commit together or not
    at all, and a finish retried after a cut finds the carve settled already.
    """
    pool = Pool.objects.filter(
        kind=Pool.Kind.RUN, run_id=run_id, run__status=Run.Status.FINISHED, carve__status="held"
    ).first()
    if pool is not None:
        ledger.refund_carve(pool)


def waiting_for_children(run: Run) -> bool:
    """Return whether `run` is parked on its children (starting them, or waiting for them)."""
    return bool(run.status == Run.Status.WAITING and (run.delegation or {}).get("state") in ("starting", "waiting"))


def start_pending(parent_id: int) -> None:
    """Start the children a parked parent's act asked for (idempotent: a call already started is kept).

    Called once the parent's iteration is recorded; the reaper calls it again for a parent
    whose worker died in between.
    """
    with transaction.atomic():
        parent = Run.objects.select_for_update().select_related("instance", "owner").filter(pk=parent_id).first()
        if parent is None or parent.status != Run.Status.WAITING or parent.delegation.get("state") != "starting":
            return
        state = dict(parent.delegation)
        already = {c.delegation.get("call"): c.pk for c in Run.objects.filter(parent=parent)
                   if c.delegation.get("iteration") == state["iteration"]}
        todo = [c for c in state["calls"] if c.get("id") not in already]
        results = start_children(parent, int(state["iteration"]), todo) if todo else []
        children = [*already.values(), *(r["child"] for r in results if "child" in r)]
        refused = [r for r in results if "error" in r]
        # What each child was asked, kept on the parent: a child that delegates in turn parks with
        # its own state in its `delegation`, so the parent must not read its call from there.
        modes = {c.get("id"): (c.get("input") or {}).get("workspace") or "own" for c in state["calls"]}
        placed = {**{pk: call for call, pk in already.items()}, **{r["child"]: r["id"] for r in results if "child" in r}}
        state.update(state="waiting", children=children, refused=refused, placed={
            str(pk): {"call": call, "workspace": modes.get(call, "own")} for pk, call in placed.items()
        })
        detail = f"children running: runs {', '.join(map(str, children))}" if children else parent.outcome_detail
        Run.objects.filter(pk=parent.pk).update(delegation=state, outcome_detail=detail)
        events.append(parent.pk, "run.delegated", {
            "iteration": state["iteration"], "children": children,
            "refused": [{"to": r["to"], "error": r["error"][:300]} for r in refused],
        })
    if not children:
        resume_parent(parent_id, parent_id=parent_id)  # every call was refused: the model reads why


def resume_parent(child_id: int, *, parent_id: int | None = None) -> bool:
    """Resume the parent of a finished child once every child of that act has finished."""
    if parent_id is None:
        parent_id = Run.objects.filter(pk=child_id).values_list("parent_id", flat=True).first()
        if parent_id is None:
            return False
    with transaction.atomic():
        parent = Run.objects.select_for_update().get(pk=parent_id)
        if parent.status != Run.Status.WAITING or parent.delegation.get("state") != "waiting":
            return False
        if parent.cancel_requested_at is not None:
            return False
        ids = list(parent.delegation.get("children", []))
        kids = list(Run.objects.filter(pk__in=ids).select_related("instance").order_by("pk"))
        if any(k.status != Run.Status.FINISHED for k in kids):
            return False
        refused = parent.delegation.get("refused", [])
        # The next instruction is this round's results and the objective, never the one before it:
        # a lead that delegates on every turn does not send a longer request each time.
        instruction = resume_instruction(render_results(parent, kids, refused), parent.objective)
        memory = Memory.of(parent.history).refused_after(
            [f"delegate refused: {' '.join(str(r.get('error', '')).split())[:200]}" for r in refused]
        )
        recorded = {
            "next_instruction": instruction, "history": memory.as_json(),
            "delegation": {**parent.delegation, "state": "done", "results": results_key(parent, kids, refused)},
        }
        # The resume is a way into the next iteration: the policy's bounds apply to it too.
        state = policy.State(
            iteration=int(parent.delegation.get("iteration") or parent.next_iteration - 1),
            max_iterations=parent.max_iterations, act_ok=True,
            deadline_passed=bool(parent.deadline and timezone.now() >= parent.deadline), refusals=memory.refusals,
        )
        if (stop := policy.resume(state)) is not None:
            from loops import lifecycle  # lazy: lifecycle imports this module

            Run.objects.filter(pk=parent.pk).update(**recorded)
            lifecycle.finish_run(parent.pk, None, stop.outcome, stop.detail)
            return True
        Run.objects.filter(pk=parent.pk).update(
            **recorded, status=Run.Status.QUEUED, lease_token=None, lease_holder="", outcome_detail="",
            lease_expires_at=tasks.pickup_deadline(), attempt=0,
        )
        events.append(parent.pk, "run.resumed", {"reason": "children finished", "children": ids})
        tasks.schedule(parent.pk, parent.next_iteration)
    return True


def waits_for(parent: Run, child_id: int) -> bool:
    """Return whether `parent` is parked on a round of children that counts run `child_id` among them."""
    state = parent.delegation or {}
    return bool(
        parent.status == Run.Status.WAITING and state.get("state") == "waiting"
        and child_id in (state.get("children") or [])
    )


def replace_child(parent: Run, old_id: int, new_id: int, *, by: str) -> None:
    """Have waiting `parent` wait for run `new_id` (a person's continuation of its child `old_id`) instead.

    Inside the caller's transaction, with `parent` locked (`services.run_continue`): the round's
    results then carry the continuation's outcome and answer (`render_results`), as they would
    have carried the child's, and the parent resumes once it (and the round's others) finished.
    """
    state = dict(parent.delegation)
    state["children"] = [new_id if pk == old_id else pk for pk in state.get("children", [])]
    placed = dict(state.get("placed") or {})
    if str(old_id) in placed:
        placed[str(new_id)] = placed.pop(str(old_id))
    state["placed"] = placed
    Run.objects.filter(pk=parent.pk).update(delegation=state)
    parent.delegation = state
    events.append(parent.pk, "run.child_continued", {"child": old_id, "as": new_id, "by": by})


def delegated_by(run: Run, *, limit: int = 100) -> Run | None:
    """Return the run that delegated the child `run` continues, when `run` is not that run's child itself.

    Follows `continued_from` back to the delegated child (a continuation of a continuation too):
    the parent no longer waited for it when it was continued, so the continuation ran as a run of
    its own, and its end is told to the person instead (`reviews.notify`). None for any other run.
    """
    if run.parent_id is not None:
        return None
    earlier = run.continued_from_id
    for _ in range(limit):
        if earlier is None:
            return None
        found = Run.objects.filter(pk=earlier).values_list("parent_id", "continued_from_id").first()
        if found is None:
            return None
        parent_id, earlier = found
        if parent_id is not None:
            return Run.objects.filter(pk=parent_id).first()
    return None


class RoleCheck:
    """A composition's grade of a proposed done: verified only when its verifying role's latest run passed."""

    def __init__(self, passed: bool, reason: str) -> None:
        self.passed = passed
        self.assessment = policy.Assessment(
            outcome="done", verified=passed, reasons=() if passed else (reason,), evidence=reason if passed else ""
        )
        self.usage = Usage()
        self.reason = reason

    def as_event(self, iteration: int) -> tuple[str, dict[str, Any]]:
        return ("grade.role", {"iteration": iteration, "passed": self.passed, "reason": self.reason})


def role_check(*, run: Any, **kwargs: Any) -> RoleCheck | None:
    """The `loops.grading.ROLE` grader: a composition's done needs its verifying role's pass."""
    template = run.instance.template if run.instance.template_id else None
    role = getattr(template, "verify_with_role", "") if template is not None else ""
    if not role:
        return None
    name = (template.roles or {}).get(role, "")
    latest = (
        Run.objects.filter(parent=run, instance__template__name=name, status=Run.Status.FINISHED)
        .order_by("-finished_at", "-pk")
        .first()
    )
    if latest is None:
        return RoleCheck(False, f"the {role} ({name}) never checked the work")
    if latest.outcome != Run.Outcome.DONE:
        return RoleCheck(False, f"the {role}'s last run (run {latest.pk}) ended {latest.outcome}: {latest.outcome_detail[:300]}")
    changed_since = (
        Run.objects.filter(parent=run, created_at__gt=latest.created_at).exclude(instance__template__name=name)
        .order_by("pk").first()
    )
    if changed_since is not None:  # a pass is for the work as it was checked, not for what came after
        return RoleCheck(False, f"the {role}'s pass (run {latest.pk}) is older than run {changed_since.pk}, which came after it")
    return RoleCheck(True, f"the {role}'s last run (run {latest.pk}) passed")


def on_run_starting(sender: Any, *, run: Any, **kwargs: Any) -> None:
    """`signals.run_starting` receiver: a child's first act is told on its parent's timeline (once)."""
    if run.parent_id is None:
        return
    with transaction.atomic():
        parent = Run.objects.select_for_update().filter(pk=run.parent_id).first()  # one event per child
        told = parent is None or parent.events.filter(kind="run.child_started", data__child=run.pk).exists()
        if not told:
            events.append(run.parent_id, "run.child_started", {"child": run.pk, "instance": run.instance.name[:100]})


def on_run_finished(sender: Any, *, run_id: int, **kwargs: Any) -> None:
    """`signals.run_finished` receiver: a child's end is told on its parent's timeline, and may resume it.

    The parent's event redraws its page's tree at once (its viewers follow its events, not the child's).
    """
    child = Run.objects.select_related("instance").filter(pk=run_id, parent__isnull=False).first()
    if child is None:
        return
    if child.status == Run.Status.FINISHED:
        with transaction.atomic():
            events.append(child.parent_id, "run.child_finished", {
                "child": child.pk, "instance": child.instance.name[:100], "outcome": child.outcome,
                "verified": child.verified, "spent_usd": money.usd_string(child.spent_micros),
            })
    elif child.status == Run.Status.WAITING:  # it asks a person: the parent's page says so
        with transaction.atomic():
            events.append(child.parent_id, "run.child_waiting", {
                "child": child.pk, "instance": child.instance.name[:100], "question": child.outcome_detail[:500],
            })
    resume_parent(run_id)


def check_parked(limit: int = 100) -> int:
    """For the reaper: start what a dead worker left unstarted, resume parents whose children all ended.

    One parked run's fault is that run's alone, and the pass goes on to the others: a parent whose
    children cannot be started finishes crashed, saying why (`_crash_unstartable`); one that cannot
    be resumed is logged once and tried again on the next pass. A transient database error ends
    the pass (the heartbeat tries again on a fresh connection).
    """
    from loops.driver import failed  # lazy: loops.driver imports loops.runner, which imports this module

    moved = 0
    parked = Run.objects.filter(status=Run.Status.WAITING, delegation__state__in=["starting", "waiting"])
    for run_id, state in parked.values_list("pk", "delegation__state")[:limit]:
        try:
            if state == "starting":
                start_pending(run_id)
                moved += 1
            elif resume_parent(run_id, parent_id=run_id):
                moved += 1
        except Exception as exc:
            failed("starting its children" if state == "starting" else "resuming it", run_id, exc)
            if state == "starting":
                moved += _crash_unstartable(run_id, exc)
    return moved


def _crash_unstartable(run_id: int, exc: Exception) -> int:
    """Finish a parked parent whose children cannot be started as crashed; return 1, or 0 if it moved on.

    Nothing of its act's calls was started (`start_pending` is one transaction), so no child holds
    a carve of it; waiting would only fail the same way on every pass.
    """
    from loops import lifecycle  # lazy: lifecycle imports this module

    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id, status=Run.Status.WAITING).first()
        if run is None or (run.delegation or {}).get("state") != "starting":
            return 0
        if Run.objects.filter(parent=run).exclude(status=Run.Status.FINISHED).exists():
            return 0
        detail = (
            f"Tether failed to start the child runs this run's delegate calls asked for "
            f"({type(exc).__name__}: {str(exc)[:300]}); the details are in the worker's log. "
            "Start a new run to try again."
        )
        return int(lifecycle.finish_run(run.pk, run.lease_token, Run.Outcome.CRASHED, detail) is not None)


def not_started(delegated: list[dict[str, Any]]) -> str:
    """Name the delegate calls a run that may not wait leaves unstarted."""
    shown = "; ".join(
        f"to {str((c.get('input') or {}).get('to', ''))[:100]!r} ({str((c.get('input') or {}).get('objective', ''))[:100]})"
        for c in delegated[:4]
    )
    more = f" and {len(delegated) - 4} more" if len(delegated) > 4 else ""
    return f"its {len(delegated)} delegate call{'s' if len(delegated) != 1 else ''} {'were' if len(delegated) != 1 else 'was'} not started: {shown}{more}"


def repeat_key(run: Run, delegated: list[dict[str, Any]], fingerprint: str) -> str:
    """What this act delegated, in the workspace it left, given the results it was given: equal keys, no progress.

    "<digest> <what was delegated>": the policy compares the whole, and names the second part.
    """
    asked = sorted(
        (str(i.get("to", "")), " ".join(str(i.get("objective", "")).split()), str(i.get("workspace") or "own"))
        for i in ((c.get("input") or {}) for c in delegated)
    )
    given = (run.delegation or {}).get("results", "") if (run.delegation or {}).get("state") == "done" else ""
    digest = hashlib.sha256(json.dumps([asked, fingerprint, given], ensure_ascii=False).encode()).hexdigest()[:16]
    named = "; ".join(f"to {to!r}: {objective[:100]!r}" for to, objective, _ in asked)
    return f"{digest} {named[:300]}"
