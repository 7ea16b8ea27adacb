import secrets

from django import forms
from django.contrib import admin, messages

from audit.trail import AuditedAdmin
from reviews.models import (
    Delivery,
    DeliveryAttempt,
    GradeRecord,
    Grading,
    NotificationTarget,
    Receipt,
    ReviewItem,
    WorkspaceSnapshot,
)


@admin.register(Grading)
class GradingAdmin(AuditedAdmin, admin.ModelAdmin):
    audit_noun = "grading"
    list_display = ["__str__", "judge", "sample_percent", "expects_changes", "updated_at"]
    raw_id_fields = ["instance"]


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(GradeRecord)
class GradeRecordAdmin(ReadOnly):
    list_display = ["run", "iteration", "outcome", "verified", "review", "created_at"]
    list_filter = ["outcome", "verified", "review"]


@admin.register(ReviewItem)
class ReviewItemAdmin(ReadOnly):
    list_display = ["run", "reason", "status", "decided_by", "decided_at", "created_at"]
    list_filter = ["reason", "status"]


@admin.register(Receipt)
class ReceiptAdmin(ReadOnly):
    list_display = ["run", "signed_at"]


@admin.register(WorkspaceSnapshot)
class WorkspaceSnapshotAdmin(ReadOnly):
    list_display = ["run", "method", "start_tree", "end_tree", "taken_at", "ended_at"]


class NotificationTargetForm(forms.ModelForm):
    """The webhook secret is write-only: typed in (or generated and shown once), never rendered back."""

    secret = forms.CharField(
        label="Webhook secret",
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text="The HMAC key the receiver checks signatures with. Blank on a new webhook: one is generated "
        "and shown once. Blank later: the current one is kept.",
    )

    class Meta:
        model = NotificationTarget
        fields = ["owner", "kind", "address", "events", "active"]

    def clean(self):
        cleaned = super().clean()
        kind, address = cleaned.get("kind"), cleaned.get("address") or ""
        if kind == NotificationTarget.Kind.WEBHOOK and not address.startswith(("https://", "http://")):
            self.add_error("address", "A webhook address is an http(s) URL.")
        if kind == NotificationTarget.Kind.EMAIL:
            try:
                forms.EmailField().clean(address)
            except forms.ValidationError:
                self.add_error("address", "Enter an e-mail address.")
        events = cleaned.get("events") or []
        unknown = NotificationTarget.unknown_events(events) if isinstance(events, list) else ["?"]
        if unknown:
            self.add_error("events", f"Unknown events: {', '.join(unknown)}; use {', '.join(NotificationTarget.Event.values)}.")
        return cleaned


@admin.register(NotificationTarget)
class NotificationTargetAdmin(AuditedAdmin, admin.ModelAdmin):
    audit_noun = "notification"
    audit_verbs = ("add", "update", "remove")
    form = NotificationTargetForm
    list_display = ["owner", "kind", "address", "active", "created_at"]
    list_filter = ["kind", "active"]

    def save_model(self, request, obj, form, change):
        secret = form.cleaned_data.get("secret")
        generated = not change and not secret and obj.kind == NotificationTarget.Kind.WEBHOOK
        if generated:
            secret = secrets.token_urlsafe(32)
        if secret:
            obj.set_secret(secret)
        super().save_model(request, obj, form, change)
        if generated:
            messages.warning(request, f"The webhook secret is {secret} — copy it now; it is not shown again.")


class DeliveryAttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    extra = 0
    can_delete = False
    readonly_fields = ["number", "at", "ok", "status_code", "error", "duration_ms"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Delivery)
class DeliveryAdmin(ReadOnly):
    list_display = ["event", "target", "status", "attempts", "next_attempt_at", "created_at"]
    list_filter = ["status", "event"]
    inlines = [DeliveryAttemptInline]
