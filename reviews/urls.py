"""The review queue and the audit export (namespace `reviews`, mounted at /reviews/)."""

from django.urls import path

from reviews import views

app_name = "reviews"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("<int:item_id>/", views.item_detail, name="item"),
    path("<int:item_id>/decide", views.item_decide, name="decide"),
    path("audit.csv", views.audit_csv, name="audit-csv"),
]
