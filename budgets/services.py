"""Writes that shape the pool tree: open a run's chain, create pools, cap a run, and a person's pool changes.

Every function runs in the caller's transaction (inside a savepoint, so an
`InvalidBudget` leaves nothing behind). Money inside pools moves only through
`budgets.ledger` (limits through `budgets.limits`). What a person does to a pool — create one (`pool_create` with `via`), set its
limit (`pool_set_limit`), top it up (`pool_top_up`), reset its period (`pool_reset_period`),
rename it or move its threshold (`pool_update`), change a run's cap (`run_set_cap` with `via`) —
goes through here and is recorded in the audit trail (`audit.trail`) with its before and
after, whatever the surface (the admin, the console, the API).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from audit import trail
from budgets import booking, leases, ledger, limits
from budgets.booking import InvalidBudget
from budgets.models import Pool
from budgets.money import format_usd, usd_string
from budgets.selectors import chain_headroom

ROOT_NAME = "organisation"


def pool_create(
    *,
    kind: str,
    name: str,
    parent: Pool | None,
    owner: Any = None,
    instance: Any = None,
    run: Any = None,
    limit: int | None = None,
    period: str = Pool.Period.NONE,
    threshold_percent: int | None = 80,
    actor: booking.Actor = None,
    own_chain: bool = False,
    leased: bool = False,
    via: str | None = None,
    request: Any = None,
) -> Pool:
    """Create a pool under `parent`; a limit given here is logged as the pool's first limit change.

    `via`: a person (`actor`) created it through that surface: the audit trail records it.

    `own_chain`: a carved pool, whose chain starts at itself (see `open_run_pools`).
    `leased`: a run pool that leases its headroom from its ancestors (see `budgets.ledger`).
    """
    if (kind == Pool.Kind.ROOT) != (parent is None):
        raise InvalidBudget("the root pool, and only it, has no parent")
    if kind not in Pool.Kind.values:
        raise InvalidBudget(f"unknown pool kind {kind!r}")
    if period not in Pool.Period.values:
        raise InvalidBudget(f"unknown period {period!r}")
    if threshold_percent is not None and not 0 <= threshold_percent <= 100:
        raise InvalidBudget(f"a threshold is a percentage, got {threshold_percent!r}")
    _check_limit(limit)
    now = timezone.now()
    with transaction.atomic():
        pool: Pool = Pool.objects.create(
            kind=kind,
            name=name[:200],
            parent=parent,
            owner=owner,
            instance=instance,
            run=run,
            period=period,
            period_start=booking.period_floor(period, now) or now,
            threshold_percent=threshold_percent,
            quota=0 if leased else None,
        )
        pool.path = f"{parent.path if parent and not own_chain else '/'}{pool.pk}/"
        Pool.objects.filter(pk=pool.pk).update(path=pool.path)
        if limit is not None:
            pool = limits.set_limit(pool, limit, actor)
        if via is not None:
            _audit(actor, "pool.create", pool, via, request, None, _shown(pool))
    return pool


def _shown(pool: Pool) -> dict[str, Any]:
    """Return what an audit entry says of a pool: its limit in dollars, its period, name and threshold."""
    return {
        "name": pool.name,
        "limit": None if pool.limit is None else usd_string(pool.limit),
        "period": pool.period,
        "threshold_percent": pool.threshold_percent,
    }


def _audit(
    user: Any, action: str, pool: Pool, via: str, request: Any,
    before: dict[str, Any] | None, after: dict[str, Any] | None, **extra: Any,
) -> None:
    trail.record(
        user=user if not isinstance(user, str) else None, action=action, pool=pool, run=pool.run, via=via,
        request=request, detail={"pool": pool.pk, **extra, **trail.changes(before, after)},
    )


def pool_set_limit(pool: Pool | int, limit: int | None, *, user: Any, via: str, request: Any = None) -> Pool:
    """Set a pool's limit (None = unlimited) as `user` did through `via`; return the pool."""
    with transaction.atomic():
        before = _shown(Pool.objects.get(pk=getattr(pool, "pk", pool)))
        changed = limits.set_limit(pool, limit, user)
        if before != _shown(changed):
            _audit(user, "pool.limit", changed, via, request, before, _shown(changed))
    return changed


def pool_top_up(pool: Pool | int, amount: int, *, user: Any, via: str, request: Any = None) -> Pool:
    """Raise a limited pool's limit by `amount` micro-dollars as `user` did through `via`; return the pool."""
    with transaction.atomic():
        before = _shown(Pool.objects.get(pk=getattr(pool, "pk", pool)))
        changed = limits.top_up(pool, amount, user)
        _audit(user, "pool.top_up", changed, via, request, before, _shown(changed), amount=usd_string(amount))
    return changed


def pool_reset_period(pool: Pool | int, *, user: Any, via: str, request: Any = None) -> Pool:
    """Start a periodic pool's spend again from zero as `user` did through `via`; return the pool."""
    with transaction.atomic():
        spent = Pool.objects.get(pk=getattr(pool, "pk", pool)).spent
        changed = limits.reset_period(pool, user)
        _audit(user, "pool.period_reset", changed, via, request, {"spent": usd_string(spent)}, {"spent": "0"})
    return changed


def pool_update(
    pool: Pool | int, *, name: str, threshold_percent: int | None, user: Any, via: str, request: Any = None
) -> Pool:
    """Rename a pool or move its soft threshold as `user` did through `via`; return the pool."""
    if threshold_percent is not None and not 0 <= threshold_percent <= 100:
        raise InvalidBudget(f"a threshold is a percentage, got {threshold_percent!r}")
    with transaction.atomic():
        locked: Pool = Pool.objects.select_for_update().get(pk=getattr(pool, "pk", pool))
        before = _shown(locked)
        locked.name, locked.threshold_percent = name[:200], threshold_percent
        Pool.objects.filter(pk=locked.pk).update(name=locked.name, threshold_percent=threshold_percent)
        if before != _shown(locked):
            _audit(user, "pool.update", locked, via, request, before, _shown(locked))
    return locked


def root_pool() -> Pool:
    """Return the organisation's root pool, creating it (unlimited) on first use."""
    pool: Pool | None = Pool.objects.filter(kind=Pool.Kind.ROOT).first()
    return pool or _create_once(
        lambda: pool_create(kind=Pool.Kind.ROOT, name=ROOT_NAME, parent=None), kind="root"
    )


def user_pool(user: Any) -> Pool:
    """Return `user`'s pool under the root, creating it (unlimited) on first use."""
    pool: Pool | None = Pool.objects.filter(kind=Pool.Kind.USER, owner=user).first()
    if pool:
        return pool
    parent = root_pool()
    return _create_once(
        lambda: pool_create(
            kind=Pool.Kind.USER, name=f"user {user.get_username()}", parent=parent, owner=user
        ),
        kind="user",
        owner=user,
    )


def instance_pool(instance: Any) -> Pool:
    """Return `instance`'s pool under its owner's pool, creating it (unlimited) on first use."""
    pool: Pool | None = Pool.objects.filter(kind=Pool.Kind.INSTANCE, instance=instance).first()
    if pool:
        return pool
    parent = user_pool(instance.owner)
    return _create_once(
        lambda: pool_create(
            kind=Pool.Kind.INSTANCE,
            name=f"instance {instance.name} (#{instance.pk})",
            parent=parent,
            owner=instance.owner,
            instance=instance,
        ),
        kind="instance",
        instance=instance,
    )


def _create_once(create: Callable[[], Pool], **lookup: Any) -> Pool:
    # Two transactions may race to create the same pool; the unique constraint lets one win.
    try:
        with transaction.atomic():
            return create()
    except IntegrityError:
        winner: Pool = Pool.objects.get(**lookup)
        return winner


def open_run_pools(run: Any, now: datetime | None = None) -> Pool:
    """Ensure the chain root -> user -> instance -> run exists for `run`; return its run pool.

    The run pool's limit is the run's cap (unlimited without one), and it holds a quota lease
    (`ledger`): the run's reservations hold money in it alone while the lease covers them.

    A child run (started by a `delegate` call) always has a cap, carved from its parent run's
    chain (`ledger.carve`): the cap is held there until the child finishes, and the child's
    pool (under its parent run's pool) is the root of the child's own chain, so the child can
    spend only what was set aside; it needs no lease.

    Called by `run_start` inside its transaction. Raises `InvalidBudget` (and changes nothing)
    for a negative cap or a cap larger than the instance chain's remaining headroom (a child's:
    its parent's chain's), with periods as they stand at `now` (default: now).
    """
    with transaction.atomic():
        existing: Pool | None = Pool.objects.filter(kind=Pool.Kind.RUN, run=run).first()
        if existing:
            return existing
        parent = instance_pool(run.instance)
        child = bool(getattr(run, "parent_id", None))
        if child:
            parent = (
                Pool.objects.filter(kind=Pool.Kind.RUN, run_id=run.parent_id).first()
                or instance_pool(run.parent.instance)
            )
        cap = None if run.max_cost_micros is None and not child else _check_cap(run.max_cost_micros)
        if cap is not None and not child:
            _check_fits(parent, cap, f"run {run.pk}", now=now)
        pool = _run_pool_create(run, parent, cap, own_chain=child, leased=not child and leases.leasing())
        if child:
            assert cap is not None
            try:
                # A child on another instance is held to that instance's pool too (its limit, its period).
                also = [] if run.instance_id == run.parent.instance_id else [instance_pool(run.instance).pk]
                ledger.carve(parent=run.parent, pool=pool, amount=cap, now=now, also=also)
            except booking.BudgetRefused as refused:
                raise InvalidBudget(f"a budget of {format_usd(cap)} does not fit: {refused.detail}") from None
        return pool


def _run_pool_create(
    run: Any, parent: Pool, cap: int | None, *, leased: bool, own_chain: bool = False, actor: booking.Actor = None
) -> Pool:
    """Create `run`'s pool under `parent`, limited to `cap`: a run pool warns at no threshold of its own."""
    return pool_create(
        kind=Pool.Kind.RUN,
        name=f"run {run.pk}",
        parent=parent,
        owner=run.owner,
        run=run,
        limit=cap,
        threshold_percent=None,
        actor=actor,
        own_chain=own_chain,
        leased=leased,
    )


def run_set_cap(
    run: Any, cap: int | None, actor: booking.Actor, *, via: str | None = None, request: Any = None
) -> Pool:
    """Give `run` a cost cap (or remove it with None), e.g. "raise the cap and resume"; return its pool.

    The caller stores `run.max_cost_micros` itself. The new cap, net of what the run has
    spent and holds, must fit in the instance chain's remaining headroom. With `via`, a person
    (`actor`) changed it through that surface: the audit trail records `pool.cap`.
    """
    before = {"cap": None if run.max_cost_micros is None else usd_string(run.max_cost_micros)}
    with transaction.atomic():
        pool = _set_cap(run, cap, actor)
        if via is not None:
            _audit(actor, "pool.cap", pool, via, request, before, {"cap": None if cap is None else usd_string(cap)},
                   run=run.pk)
    return pool


def _set_cap(run: Any, cap: int | None, actor: booking.Actor) -> Pool:
    with transaction.atomic():
        pool: Pool | None = Pool.objects.filter(kind=Pool.Kind.RUN, run=run).first()
        if pool is None:
            if cap is None:
                return instance_pool(run.instance)
            parent = instance_pool(run.instance)
            cap = _check_cap(cap)
            _check_fits(parent, cap, f"run {run.pk}")
            return _run_pool_create(run, parent, cap, actor=actor, leased=leases.leasing())
        if cap is not None:
            cap = _check_cap(cap)
            assert pool.parent is not None
            _check_fits(pool.parent, cap - pool.spent - pool.reserved, f"run {run.pk}", cap)
        return limits.set_limit(pool, cap, actor)


def _check_limit(limit: Any, what: str = "a limit") -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidBudget(f"{what} must be a whole number of micro-dollars, got {limit!r}")
    if limit < 0:
        raise InvalidBudget(f"{what} cannot be negative, got {format_usd(limit)}")
    return limit


def _check_cap(cap: Any) -> int:
    checked = _check_limit(cap, what="a run's cost cap")
    if checked is None:
        raise InvalidBudget("a run's cost cap must be a number")
    return checked


def _check_fits(
    parent: Pool, needed: int, label: str, cap: int | None = None, now: datetime | None = None
) -> None:
    remaining, tightest = chain_headroom(Pool.objects.filter(pk__in=parent.chain_ids()), now)
    if remaining is not None and needed > remaining:
        assert tightest is not None
        raise InvalidBudget(
            f"a cap of {format_usd(cap if cap is not None else needed)} for {label} is more than pool "
            f"{tightest.name!r} has left ({format_usd(remaining)})"
        )


def close_deleted_run(run: Any) -> None:
    """No reservation outlives its run: a run deleted while money is held settles it conservatively.

    Called by `loops` as its `Run` is deleted (budgets knows no run model).
    """
    ledger.close_abandoned(run, actor="run deleted")
    ledger.return_run_lease(run.pk, actor="run deleted")
