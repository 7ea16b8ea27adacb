"""Django admin for triggers (the secret is never shown: rotate it from the console or the API) and schedules."""

from django.contrib import admin
from django.utils import timezone

from audit.trail import AuditedAdmin
from triggers import scheduling
from triggers.models import Delivery, Firing, Schedule, Trigger


class DeliveryInline(admin.TabularInline):
    model = Delivery
    extra = 0
    can_delete = False
    fields = ("received_at", "delivery_id", "event", "outcome", "status", "reason", "run")
    readonly_fields = fields
    ordering = ("-received_at",)
    max_num = 0
    show_change_link = True


@admin.register(Trigger)
class TriggerAdmin(AuditedAdmin, admin.ModelAdmin):
    audit_noun = "trigger"  # the one admin hook: a change (pausing, resuming) or a delete, before and after
    audit_verbs = ("create", "change", "delete")
    list_display = ("id", "name", "instance", "owner", "active", "max_per_minute", "secret_set_at")
    list_filter = ("active",)
    search_fields = ("name", "instance__name", "owner__username")
    # An operator may pause a trigger or delete it; what it does is its owner's to change (console, API).
    fields = (
        "instance",
        "owner",
        "name",
        "objective_template",
        "events",
        "actions",
        "max_iterations",
        "max_cost_micros",
        "max_per_minute",
        "active",
        "secret_set_at",
        "created_at",
    )
    readonly_fields = tuple(f for f in fields if f != "active")
    inlines = [DeliveryInline]

    def has_add_permission(self, request):  # made where its secret can be shown once: the console or the API
        return False


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


class FiringInline(admin.TabularInline):
    model = Firing
    extra = 0
    can_delete = False
    fields = ("scheduled_for", "fired_at", "outcome", "reason", "manual", "run")
    readonly_fields = fields
    ordering = ("-scheduled_for",)
    max_num = 0


@admin.register(Schedule)
class ScheduleAdmin(AuditedAdmin, admin.ModelAdmin):
    audit_noun = "schedule"  # a change (pausing, resuming) or a delete, before and after
    audit_verbs = ("create", "change", "delete")
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
    search_fields = ("name", "instance__name", "owner__username")
    # An operator may pause a schedule or delete it; when and what it runs is its owner's to change.
    fields = (
        "instance",
        "owner",
        "name",
        "objective_template",
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
    readonly_fields = tuple(f for f in fields if f != "active")
    inlines = [FiringInline]

    def has_add_permission(
        self, request
    ):  # made where its timing is checked and previewed: the console or the API
        return False

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        scheduling.reschedule(
            obj, timezone.now()
        )  # paused: no next firing; resumed: from now, nothing caught up
