from django.contrib import admin

from loops.models import ToolCall


@admin.register(ToolCall)
class ToolCallAdmin(admin.ModelAdmin):
    """The journal of Claude-brain tool calls, to read. Rows go with their run (deleting a user or an
    instance in the admin deletes them too), so deleting stays allowed."""

    list_display = ["__str__", "name", "attempt", "is_error", "started_at", "finished_at"]
    list_filter = ["name", "is_error"]
    raw_id_fields = ["run"]

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False
