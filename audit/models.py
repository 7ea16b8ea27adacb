"""The audit trail's one table: `AuditEntry`, written by `audit.trail.record` only."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models


class AuditEntry(models.Model):
    """One human action: who, when, from which device and interface, on what."""

    class Via(models.TextChoices):
        API = "api"
        CONSOLE = "console"
        CLI = "cli"
        ADMIN = "admin"
        SYSTEM = "system"
        MCP = "mcp"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    username = models.CharField(max_length=150, blank=True, help_text="kept when the user is deleted")
    action = models.CharField(max_length=60, db_index=True)
    run = models.ForeignKey(
        "loops.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_entries"
    )
    pool = models.ForeignKey(
        "budgets.Pool", null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_entries"
    )
    instance = models.ForeignKey(
        "instances.Instance", null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_entries"
    )
    # Whose agent, key, token, pool or account the action was on (a person's page shows these).
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    run_ref = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="the run's id, kept after deletion"
    )
    pool_ref = models.PositiveBigIntegerField(null=True, blank=True)
    instance_ref = models.PositiveBigIntegerField(null=True, blank=True, db_index=True)
    detail = models.JSONField(default=dict, blank=True)
    via = models.CharField(max_length=10, choices=Via.choices)
    user_agent = models.CharField(max_length=400, blank=True)
    ip_address = models.GenericIPAddressField(null=True, blank=True)
    created_at = models.DateTimeField(db_index=True)

    class Meta:
        db_table = "reviews_auditentry"  # where the trail was kept before it had its own app
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.username or 'someone'} {self.action} at {self.created_at:%Y-%m-%d %H:%M:%S}"

    def changes(self) -> list[tuple[str, Any, Any]]:
        """Return (field, before, after) for each field the action changed (from `detail`), as pages show them."""
        before, after = self.detail.get("before"), self.detail.get("after")
        if not isinstance(before, dict) or not isinstance(after, dict):
            return []
        return [(name, before.get(name, "—"), after.get(name, "—")) for name in sorted({*before, *after})]
