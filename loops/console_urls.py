"""The console's pages and form posts (namespace `loops`)."""

from django.urls import path

from loops.console import views

app_name = "loops"

urlpatterns = [
    path("", views.fleet, name="fleet"),
    path("instances/<int:instance_id>/", views.instance_detail, name="instance-detail"),
    path("instances/<int:instance_id>/start", views.run_start, name="run-start"),
    path("runs/<int:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<int:run_id>/stop", views.run_stop, name="run-stop"),
    path("runs/<int:run_id>/interject", views.run_interject, name="run-interject"),
    path("runs/<int:run_id>/close", views.run_close, name="run-close"),
    path("runs/<int:run_id>/resume", views.run_resume, name="run-resume"),
    path("runs/<int:run_id>/timeline", views.run_timeline, name="run-timeline"),
    path("history/", views.history, name="history"),
]
