"""Admin for pools, the ledger, reservations and prices.

Money never changes through a plain model save here: a new pool, a new limit, a top-up, a period
reset, a new name or threshold go through `budgets.services` (`pool_create`, `pool_set_limit`,
`pool_top_up`, `pool_reset_period`, `pool_update`), so every change is a ledger entry naming the
person and an audit entry (via admin) with its before and after. Prices are recorded by the
audit trail's admin hook (`audit.trail.AuditedAdmin`).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from audit import trail
from audit.trail import AuditedAdmin
from budgets import booking, selectors, services, spending
from budgets.models import LedgerEntry, Pool, Price, Reservation
from budgets.money import format_usd, micros_to_decimal, usd_to_micros

LEDGER_ROWS = 50
USD = {"max_digits": 16, "decimal_places": 6, "min_value": Decimal(0)}


class PoolForm(forms.ModelForm):
    limit_usd = forms.DecimalField(label="Limit (USD)", required=False, help_text="empty = unlimited", **USD)
    top_up_usd = forms.DecimalField(
        label="Top up (USD)", required=False, help_text="adds to the limit; recorded in the ledger", **USD
    )

    class Meta:
        model = Pool
        fields = ["name", "kind", "parent", "owner", "instance", "run", "period", "threshold_percent"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk and self.instance.limit is not None:
            self.fields["limit_usd"].initial = micros_to_decimal(self.instance.limit)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        limit = data.get("limit_usd")
        data["limit"] = None if limit is None else usd_to_micros(limit)
        pool = self.instance
        if pool.pk:
            spent = booking.effective_spent(pool)
            if data["limit"] is not None and data["limit"] < spent:
                self.add_error("limit_usd", f"This pool has already spent {format_usd(spent)} this period.")
            if data.get("top_up_usd") and data["limit"] is None:
                self.add_error("top_up_usd", "An unlimited pool cannot be topped up; set a limit instead.")
        else:
            kind, parent = data.get("kind"), data.get("parent")
            if (kind == Pool.Kind.ROOT) != (parent is None):
                self.add_error("parent", "The root pool, and only it, has no parent.")
        return data


@admin.display(description="limit")
def _limit(pool: Pool) -> str:
    return format_usd(pool.limit)


@admin.display(description="spent")
def _spent(pool: Pool) -> str:
    return format_usd(booking.effective_spent(pool))


@admin.display(description="reserved")
def _reserved(pool: Pool) -> str:
    return format_usd(pool.reserved)


@admin.display(description="remaining")
def _remaining(pool: Pool) -> str:
    return format_usd(selectors.pool_headroom(pool).remaining)


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    form = PoolForm
    list_display = ["name", "kind", "parent", _limit, _spent, _reserved, _remaining, "period"]
    list_filter = ["kind", "period"]
    search_fields = ["name"]
    raw_id_fields = ["parent", "owner", "instance", "run"]
    readonly_fields = [
        "path",
        _spent,
        _reserved,
        _remaining,
        "period_start",
        "threshold_flagged_at",
        "children_links",
        "recent_ledger",
        "recent_audit",
    ]
    actions = ["reset_period"]

    def get_fields(self, request: HttpRequest, obj: Pool | None = None) -> list[Any]:
        fields = list(super().get_fields(request, obj))
        if obj is None:
            # A top-up needs a pool that exists; a new pool starts from its limit.
            fields.remove("top_up_usd")
        return fields

    def get_readonly_fields(self, request: HttpRequest, obj: Pool | None = None) -> list[Any]:
        fields = list(self.readonly_fields)
        if obj is not None:
            # The tree and the period are fixed once a pool exists: no cycles, no silent re-basing.
            fields += ["kind", "parent", "owner", "instance", "run", "period"]
        return fields

    @admin.display(description="children")
    def children_links(self, pool: Pool) -> str:
        children = pool.children.all()
        if not children:
            return "—"
        return format_html_join(
            ", ",
            '<a href="{}">{}</a>',
            ((reverse("admin:budgets_pool_change", args=[c.pk]), c.name) for c in children),
        )

    @admin.display(description=f"ledger (latest {LEDGER_ROWS})")
    def recent_ledger(self, pool: Pool) -> str:
        if pool.pk is None:
            return "—"
        entries = pool.entries.order_by("-pk")[:LEDGER_ROWS]
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    e.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                    e.kind,
                    format_usd(e.amount),
                    format_usd(e.spent_after),
                    format_usd(e.reserved_after),
                    format_usd(e.limit_after),
                    e.run_id or "",
                    e.actor_label,
                )
                for e in entries
            ),
        )
        link = reverse("admin:budgets_ledgerentry_changelist") + f"?pool__exact={pool.pk}"
        return format_html(
            "<table><tr><th>at</th><th>kind</th><th>amount</th><th>spent</th><th>reserved</th><th>limit</th>"
            '<th>run</th><th>by</th></tr>{}</table><p><a href="{}">all entries</a></p>',
            rows,
            link,
        )

    @admin.display(description=f"changes (latest {trail.PAGE_ENTRIES})")
    def recent_audit(self, pool: Pool) -> str:
        if pool.pk is None:
            return "—"
        entries = trail.audit_for_pool(pool).order_by("-created_at", "-id")[: trail.PAGE_ENTRIES]
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    e.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                    e.username or "—",
                    e.action,
                    e.via,
                    "; ".join(f"{field}: {before} → {after}" for field, before, after in e.changes()),
                )
                for e in entries
            ),
        )
        return format_html(
            "<table><tr><th>at</th><th>by</th><th>action</th><th>via</th><th>before → after</th></tr>{}</table>",
            rows,
        )

    def save_model(self, request: HttpRequest, obj: Pool, form: PoolForm, change: bool) -> None:
        data = form.cleaned_data
        if not change:
            created = services.pool_create(
                kind=data["kind"],
                name=data["name"],
                parent=data.get("parent"),
                owner=data.get("owner"),
                instance=data.get("instance"),
                run=data.get("run"),
                limit=data["limit"],
                period=data["period"],
                threshold_percent=data.get("threshold_percent"),
                actor=request.user,
                via="admin",
                request=request,
            )
            obj.pk = created.pk
            return
        services.pool_update(
            obj.pk, name=data["name"], threshold_percent=data.get("threshold_percent"), user=request.user,
            via="admin", request=request,
        )
        if data["limit"] != Pool.objects.values_list("limit", flat=True).get(pk=obj.pk):
            services.pool_set_limit(obj.pk, data["limit"], user=request.user, via="admin", request=request)
        if data.get("top_up_usd"):
            services.pool_top_up(
                obj.pk, usd_to_micros(data["top_up_usd"]), user=request.user, via="admin", request=request
            )

    @admin.action(description="Reset the period of the selected pools (spent starts again from zero)")
    def reset_period(self, request: HttpRequest, queryset: QuerySet[Pool]) -> None:
        for pool in queryset:
            try:
                services.pool_reset_period(pool, user=request.user, via="admin", request=request)
            except booking.InvalidBudget as error:
                self.message_user(request, str(error), messages.ERROR)
            else:
                self.message_user(request, f"{pool.name}: period reset", messages.SUCCESS)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "created_at",
        "pool",
        "kind",
        "amount_usd",
        "spent_after",
        "reserved_after",
        "run_id",
        "actor_label",
    ]
    list_filter = ["kind"]
    list_select_related = ["pool"]
    search_fields = ["pool__name", "note", "actor_label"]
    date_hierarchy = "created_at"

    @admin.display(description="amount")
    def amount_usd(self, entry: LedgerEntry) -> str:
        return format_usd(entry.amount)


class ReservationChoiceFilter(admin.SimpleListFilter):
    """Filter reservations by a table of choices: value -> (label, lookup)."""

    # Not `choices`: SimpleListFilter.choices yields the links of the sidebar.
    by_value: dict[str, tuple[str, dict[str, int]]]

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(value, label) for value, (label, _) in self.by_value.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Reservation]) -> QuerySet[Reservation]:
        choice = self.by_value.get(self.value() or "")
        return queryset if choice is None else queryset.filter(**choice[1])


class OverdrawnFilter(ReservationChoiceFilter):
    title = "overdraft"
    parameter_name = "overdrawn"
    by_value = {
        "yes": ("overdrawn (settled beyond its reservation)", {"overdraft__gt": 0}),
        "no": ("within its reservation", {"overdraft": 0}),
    }


class MeteredFilter(ReservationChoiceFilter):
    title = "kind"
    parameter_name = "kind"
    by_value = {
        "metered": ("metered model calls", {"call__gt": 0}),
        "reported": ("an iteration's reported spend (call 0)", {"call": 0}),
    }


# What a reservation is, in the order both its list and its page show it.
RESERVATION_SHOWN = [
    "run_id", "iteration", "call", "model", "tokens", "status", "amount_usd", "actual_usd", "overdraft_usd",
]


@admin.register(Reservation)
class ReservationAdmin(ReadOnlyAdmin):
    """Every reservation: one metered model call (call 1, 2, ...) or an iteration's reported spend (call 0)."""

    list_display = ["id", *RESERVATION_SHOWN, "created_at"]
    list_filter = [OverdrawnFilter, MeteredFilter, "status"]
    search_fields = ["=run_id", "model"]
    fields = [
        *RESERVATION_SHOWN,
        "overdraft_cause",
        "paid_by",
        "created_at",
        "closed_at",
    ]
    readonly_fields = fields

    class Media:
        css = {"all": ["budgets/admin.css"]}

    @admin.display(description="amount")
    def amount_usd(self, reservation: Reservation) -> str:
        return format_usd(reservation.amount)

    @admin.display(description="actual")
    def actual_usd(self, reservation: Reservation) -> str:
        return "—" if reservation.actual is None else format_usd(reservation.actual)

    @admin.display(description="overdraft", ordering="overdraft")
    def overdraft_usd(self, reservation: Reservation) -> str:
        if not reservation.overdraft:
            return "—"
        return format_html('<strong class="overdraft">{}</strong>', format_usd(reservation.overdraft))

    @admin.display(description="overdraft cause")
    def overdraft_cause(self, reservation: Reservation) -> str:
        cause = spending.overdraft_cause(reservation)
        return format_html('<span class="overdraft">{}</span>', cause) if cause else "—"

    @admin.display(description="tokens (in / out / cache write / cache read)")
    def tokens(self, reservation: Reservation) -> str:
        if not reservation.usage:
            return "—"
        return " / ".join(f"{n:,}" for n in spending.tokens_of(reservation.usage).values())

    @admin.display(description="paid by (root first)")
    def paid_by(self, reservation: Reservation) -> str:
        # A leased run pool in the chain draws on its ancestors: they pay too.
        paths = Pool.objects.filter(pk__in=reservation.chain or []).values_list("path", flat=True)
        ids = {int(part) for path in paths for part in path.strip("/").split("/") if part}
        pools = Pool.objects.filter(pk__in=ids).order_by("path")
        return format_html_join(
            " › ",
            '<a href="{}">{}</a>',
            ((reverse("admin:budgets_pool_change", args=[p.pk]), p.name) for p in pools),
        ) or "—"


@admin.register(Price)
class PriceAdmin(AuditedAdmin, admin.ModelAdmin):
    audit_noun = "price"
    list_display = [
        "model",
        "effective_from",
        "input_usd_per_mtok",
        "output_usd_per_mtok",
        "cache_write_usd_per_mtok",
        "cache_read_usd_per_mtok",
    ]
    search_fields = ["model"]
    list_filter = ["effective_from"]
