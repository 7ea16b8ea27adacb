"""Django admin for triggers (the secret is never shown: rotate it from the console or the API) and schedules."""

from django.contrib import admin
from django.utils import timezone

from audit.trail import AuditedAdmin
from triggers import scheduling
from triggers.models import Delivery, Firing, Schedule, Trigger

OWNED = ("instance", "owner", "name", "objective_template")  # what a trigger and a schedule both start with


class _History(admin.TabularInline):
    """A trigger's deliveries or a schedule's firings: read only, newest first."""

    extra = 0
    can_delete = False
    max_num = 0

    def get_readonly_fields(self, request, obj=None):
        return self.fields


class _Owned(AuditedAdmin, admin.ModelAdmin):
    """A trigger or a schedule: an operator may pause it (`active`) or delete it; the rest is its owner's to change,
    and it is made where its owner is (the console or the API)."""

    audit_verbs = ("create", "change", "delete")
    search_fields = ("name", "instance__name", "owner__username")

    def get_readonly_fields(self, request, obj=None):
        return tuple(f for f in self.fields if f != "active")

    def has_add_permission(self, request):
        return False


class DeliveryInline(_History):
    model = Delivery
    fields = ("received_at", "delivery_id", "event", "outcome", "status", "reason", "run")
    ordering = ("-received_at",)
    show_change_link = True


@admin.register(Trigger)
class TriggerAdmin(_Owned):
    audit_noun = "trigger"  # the one admin hook: a change (pausing, resuming) or a delete, before and after
    list_display = ("id", "name", "instance", "owner", "active", "max_per_minute", "secret_set_at")
    list_filter = ("active",)
    # What a trigger does is its owner's to change (console, API); its secret can be shown once only there.
    fields = (
        *OWNED,
        "events",
        "actions",
        "max_iterations",
        "max_cost_micros",
        "max_per_minute",
        "active",
        "secret_set_at",
        "created_at",
    )
    inlines = [DeliveryInline]


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ("id", "trigger", "delivery_id", "event", "outcome", "status", "received_at", "run")
    list_filter = ("outcome", "status")
    search_fields = ("delivery_id",)
    readonly_fields = (
        "trigger",
        "delivery_id",
        "event",
        "received_at",
        "outcome",
        "status",
        "reason",
        "headers",
        "body_excerpt",
        "body_bytes",
        "run",
    )

    def has_add_permission(self, request):
        return False


class FiringInline(_History):
    model = Firing
    fields = ("scheduled_for", "fired_at", "outcome", "reason", "manual", "run")
    ordering = ("-scheduled_for",)


@admin.register(Schedule)
class ScheduleAdmin(_Owned):
    audit_noun = "schedule"  # a change (pausing, resuming) or a delete, before and after
    list_display = (
        "id",
        "name",
        "instance",
        "owner",
        "active",
        "cron",
        "interval_minutes",
        "timezone",
        "next_fire_at",
    )
    list_filter = ("active", "overlap")
    # When and what a schedule runs is its owner's to change, where its timing is checked and previewed.
    fields = (
        *OWNED,
        "cron",
        "interval_minutes",
        "timezone",
        "starts_at",
        "ends_at",
        "max_iterations",
        "max_cost_micros",
        "overlap",
        "catch_up_minutes",
        "active",
        "next_fire_at",
        "created_at",
    )
    inlines = [FiringInline]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        scheduling.reschedule(
            obj, timezone.now()
        )  # paused: no next firing; resumed: from now, nothing caught up
