"""The review queue, the audit export and notification settings (namespace `reviews`, at /reviews/)."""

from django.urls import path

from reviews import views

app_name = "reviews"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("<int:item_id>/", views.item_detail, name="item"),
    path("<int:item_id>/decide", views.item_decide, name="decide"),
    path("<int:item_id>/reopen", views.item_reopen, name="reopen"),
    path("audit.csv", views.audit_csv, name="audit-csv"),
    path("digest/", views.since_last_looked, name="digest"),
    path("digest/seen", views.digest_mark_seen, name="digest-seen"),
    path("digest/settings", views.digest_settings, name="digest-settings"),
    path("notifications/", views.notifications, name="notifications"),
    path("notifications/<int:target_id>/remove", views.notification_remove, name="notification-remove"),
]
