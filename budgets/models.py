# mypy: disallow-subclassing-any=False
"""Budget pools, reservations, the append-only ledger and the price table.

Money is integer micro-dollars (BigIntegerField) everywhere; prices are Decimal USD
per million tokens. Pools and reservations change only through `budgets.ledger`
(limits, top-ups and period resets through `budgets.limits`), which writes one `LedgerEntry` per pool per change.
"""

from __future__ import annotations

from datetime import date
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone


class Pool(models.Model):
    """A node of the budget tree: root -> team/user -> instance -> run.

    `limit` None means unlimited. `spent` counts the current period only (it starts
    again from zero at each period boundary, lazily, with a `period_reset` entry);
    `reserved` is the sum of the held reservations whose chain includes this pool.
    `path` is the materialised chain "/root/.../self/" (ids), fixed at creation: the pools a
    reservation made here holds money in. A child run's pool is carved (`Reservation.carved`):
    its limit is money held for it in its parent run's chain, so its own chain starts at itself
    ("/self/") while `parent` still names the pool it was carved from.

    A run pool leases its headroom (`quota`): it draws slices of its ancestors' headroom as
    reservations of their own (`Reservation.lease_for`), and its run's reservations then hold
    money in the run pool alone (`Reservation.on_lease`), so a metered call locks one row, not
    the shared root and user rows. The slices return, booked at what the run spent, when the
    run finishes or parks (`ledger.return_lease`).
    """

    class Kind(models.TextChoices):
        ROOT = "root"
        TEAM = "team"
        USER = "user"
        INSTANCE = "instance"
        RUN = "run"

    class Period(models.TextChoices):
        NONE = "none"
        DAILY = "daily"
        MONTHLY = "monthly"

    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    parent = models.ForeignKey(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="children"
    )
    path = models.CharField(max_length=255, blank=True, editable=False, db_index=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="budget_pools",
    )
    instance = models.ForeignKey(
        "instances.Instance", on_delete=models.SET_NULL, null=True, blank=True, related_name="budget_pools"
    )
    run = models.ForeignKey(
        "loops.Run", on_delete=models.SET_NULL, null=True, blank=True, related_name="budget_pools"
    )

    limit = models.BigIntegerField(null=True, blank=True, help_text="micro-dollars; empty = unlimited")
    spent = models.BigIntegerField(default=0, help_text="micro-dollars settled in the current period")
    reserved = models.BigIntegerField(default=0, help_text="micro-dollars held by open reservations")
    period = models.CharField(max_length=10, choices=Period.choices, default=Period.NONE)
    period_start = models.DateTimeField(default=timezone.now)
    threshold_percent = models.PositiveSmallIntegerField(
        null=True, blank=True, default=80, help_text="soft threshold (% of the limit); empty = none"
    )
    # Set when the soft threshold was crossed in the current period; cleared at a period reset.
    threshold_flagged_at = models.DateTimeField(null=True, blank=True)
    # A quota lease (run pools): `quota` is the headroom this pool holds in its ancestors (its held
    # `Reservation.lease_for` slices); `quota_used` what its own reservations have taken of it.
    # None: not leased (a shared pool, or a carved pool whose limit is already set aside for it).
    quota = models.BigIntegerField(
        null=True, blank=True, help_text="micro-dollars leased from the ancestors; empty = no lease"
    )
    quota_used = models.BigIntegerField(default=0, help_text="micro-dollars of the lease spent or held here")
    # Its run finished (or parked) while reservations were still held on the lease (a child's carve,
    # a call in flight): the lease returns the rest as soon as the last of them settles.
    lease_ending = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["path"]
        constraints = [
            models.CheckConstraint(
                condition=Q(limit__isnull=True) | Q(limit__gte=0), name="pool_limit_not_negative"
            ),
            models.CheckConstraint(condition=Q(spent__gte=0), name="pool_spent_not_negative"),
            models.CheckConstraint(condition=Q(reserved__gte=0), name="pool_reserved_not_negative"),
            models.CheckConstraint(
                condition=Q(quota__isnull=True) | Q(quota__gte=0), name="pool_quota_not_negative"
            ),
            models.CheckConstraint(
                condition=Q(threshold_percent__isnull=True) | Q(threshold_percent__lte=100),
                name="pool_threshold_is_a_percentage",
            ),
            models.CheckConstraint(
                condition=Q(kind="root", parent__isnull=True) | (~Q(kind="root") & Q(parent__isnull=False)),
                name="pool_only_root_has_no_parent",
            ),
            models.UniqueConstraint(fields=["kind"], condition=Q(kind="root"), name="pool_one_root"),
            models.UniqueConstraint(fields=["owner"], condition=Q(kind="user"), name="pool_one_per_user"),
            models.UniqueConstraint(
                fields=["instance"], condition=Q(kind="instance"), name="pool_one_per_instance"
            ),
            models.UniqueConstraint(fields=["run"], condition=Q(kind="run"), name="pool_one_per_run"),
        ]

    def __str__(self) -> str:
        return str(self.name)

    def chain_ids(self) -> list[int]:
        """Return the ids of the pools a reservation here holds money in, outermost first.

        This pool and its ancestors up to the root, or up to itself for a carved pool.
        """
        return [int(part) for part in self.path.strip("/").split("/") if part]

    def clean(self) -> None:
        if self.limit is not None and self.limit < 0:
            raise ValidationError({"limit": "A limit cannot be negative."})
        if self.parent_id is not None and self.pk is not None:
            ancestor = self.parent
            while ancestor is not None:
                if ancestor.pk == self.pk:
                    raise ValidationError({"parent": "A pool cannot be its own ancestor."})
                ancestor = ancestor.parent


class Reservation(models.Model):
    """Money held for one iteration of one run across its pool chain, until settled.

    Or a carve (`carved` set, no run): a child run's budget, held in its parent run's chain
    while the child runs, and settled at what the child's pool spent when the child finishes.
    """

    class Status(models.TextChoices):
        HELD = "held"
        SETTLED = "settled"
        RELEASED = "released"
        ABANDONED = "abandoned"

    # A plain id, not a foreign key: the money trail outlives a deleted run.
    # None: a metered call made for no run (a one-off decision through the API).
    run_id = models.BigIntegerField(verbose_name="run", null=True, blank=True)
    iteration = models.PositiveIntegerField()
    # 0: the iteration's own reservation (an act whose spend is reported, not metered);
    # 1, 2, ...: one metered model call each, reserved just before it goes out.
    call = models.PositiveIntegerField(default=0)
    model = models.CharField(max_length=100, blank=True, help_text="the model a metered call used")
    usage = models.JSONField(
        default=dict, blank=True, help_text="a metered call's tokens as the provider reported them"
    )
    amount = models.BigIntegerField(help_text="micro-dollars reserved")
    actual = models.BigIntegerField(null=True, blank=True, help_text="micro-dollars settled")
    overdraft = models.BigIntegerField(default=0, help_text="micro-dollars settled beyond the reservation")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.HELD)
    # The pool ids the reservation holds money in, ascending (the lock order).
    chain = models.JSONField(default=list)
    # A carve: the child run's pool whose limit this holds in its parent run's chain.
    carved = models.OneToOneField(
        "Pool", on_delete=models.PROTECT, null=True, blank=True, related_name="carve",
        help_text="a carve: the child run's pool this holds the budget of",
    )
    # A slice of a run pool's lease: money held in the pool's ancestors for it (`chain` = them).
    lease_for = models.ForeignKey(
        "Pool", on_delete=models.PROTECT, null=True, blank=True, related_name="lease_slices",
        help_text="a lease slice: the run pool this holds headroom for in its ancestors",
    )
    # A reservation drawing on its run pool's lease (`chain` = that pool alone).
    on_lease = models.ForeignKey(
        "Pool", on_delete=models.PROTECT, null=True, blank=True, related_name="leased_reservations",
        help_text="the run pool whose lease this reservation draws on",
    )
    created_at = models.DateTimeField(default=timezone.now)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["run_id", "iteration", "call"],
                condition=Q(status="held"),
                name="reservation_one_held_per_call",
            ),
            models.CheckConstraint(condition=Q(amount__gte=0), name="reservation_amount_not_negative"),
            models.CheckConstraint(
                condition=Q(actual__isnull=True) | Q(actual__gte=0), name="reservation_actual_not_negative"
            ),
        ]
        indexes = [models.Index(fields=["run_id", "status"], name="reservation_run_status")]

    def __str__(self) -> str:
        if self.carved_id is not None:
            return f"reservation {self.pk} (carve of pool {self.carved_id}, {self.status})"
        if self.lease_for_id is not None:
            return f"reservation {self.pk} (lease slice of pool {self.lease_for_id}, {self.status})"
        call = f", call {self.call}" if self.call else ""
        return f"reservation {self.pk} (run {self.run_id}, iteration {self.iteration}{call}, {self.status})"


class LedgerEntry(models.Model):
    """One append-only line of a pool's ledger, with the balances right after it.

    `spent_delta` / `reserved_delta` / `limit_after` make every pool's balance a sum of
    its entries: spent == Σ spent_delta (period resets subtract), reserved == Σ reserved_delta.
    """

    class Kind(models.TextChoices):
        RESERVE = "reserve"
        SETTLE = "settle"
        RELEASE = "release"
        ABANDONED = "abandoned"
        OVERDRAFT = "overdraft"
        TOP_UP = "top_up"
        LIMIT = "limit"
        PERIOD_RESET = "period_reset"
        THRESHOLD = "threshold"

    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="entries")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    amount = models.BigIntegerField(default=0, help_text="micro-dollars this entry is about")
    spent_delta = models.BigIntegerField(default=0)
    reserved_delta = models.BigIntegerField(default=0)
    spent_after = models.BigIntegerField()
    reserved_after = models.BigIntegerField()
    limit_after = models.BigIntegerField(null=True, blank=True)
    reservation = models.ForeignKey(
        Reservation, on_delete=models.PROTECT, null=True, blank=True, related_name="entries"
    )
    run_id = models.BigIntegerField(null=True, blank=True, verbose_name="run")
    iteration = models.PositiveIntegerField(null=True, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    actor_label = models.CharField(max_length=150)
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "ledger entries"
        indexes = [models.Index(fields=["pool", "kind"], name="ledgerentry_pool_kind")]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount} on {self.pool_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise ValueError("ledger entries are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise ValueError("ledger entries are append-only")


class PriceQuerySet(models.QuerySet):
    def for_model(self, model: str, on: date | None = None) -> Price | None:
        """Return the price in force for `model` on date `on` (today by default).

        The longest `model` prefix wins, so "claude-sonnet-4-5-20250929" uses the row for
        "claude-sonnet-4-5", and a model without its own row uses its family's.
        """
        on = on or timezone.now().date()
        best: Price | None = None
        for price in self.filter(effective_from__lte=on).order_by("-effective_from", "id"):
            if not model.startswith(price.model):
                continue
            if best is None or len(price.model) > len(best.model):
                best = price
        return best


class Price(models.Model):
    """What a model costs, in USD per million tokens, from a date on."""

    model = models.CharField(max_length=100, help_text="a model name or a prefix of one (a family)")
    input_usd_per_mtok = models.DecimalField(max_digits=12, decimal_places=6)
    output_usd_per_mtok = models.DecimalField(max_digits=12, decimal_places=6)
    cache_write_usd_per_mtok = models.DecimalField(max_digits=12, decimal_places=6)
    cache_read_usd_per_mtok = models.DecimalField(max_digits=12, decimal_places=6)
    effective_from = models.DateField()

    objects = PriceQuerySet.as_manager()

    class Meta:
        ordering = ["model", "-effective_from"]
        constraints = [
            models.UniqueConstraint(fields=["model", "effective_from"], name="price_once_per_model_and_date"),
            models.CheckConstraint(
                condition=Q(input_usd_per_mtok__gte=0)
                & Q(output_usd_per_mtok__gte=0)
                & Q(cache_write_usd_per_mtok__gte=0)
                & Q(cache_read_usd_per_mtok__gte=0),
                name="price_not_negative",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.model} from {self.effective_from}"
