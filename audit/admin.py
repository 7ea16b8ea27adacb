from django.contrib import admin

from audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ["created_at", "username", "action", "run_ref", "pool_ref", "instance_ref", "owner", "via", "user_agent"]
    list_filter = ["action", "via"]
    search_fields = ["username", "action", "user_agent"]

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # the trail is append-only
