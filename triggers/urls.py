"""The console's trigger and schedule pages (namespace `triggers`)."""

from django.urls import path

from triggers import schedule_views, views

app_name = "triggers"

urlpatterns = [
    path("instances/<int:instance_id>/triggers/", views.trigger_list, name="list"),
    path("triggers/<int:trigger_id>/rotate", views.trigger_rotate, name="rotate"),
    path("triggers/<int:trigger_id>/pause", views.trigger_pause, name="pause"),
    path("triggers/<int:trigger_id>/delete", views.trigger_delete, name="delete"),
    path("instances/<int:instance_id>/schedules/", schedule_views.schedule_list, name="schedules"),
    path("schedules/<int:schedule_id>/edit", schedule_views.schedule_edit, name="schedule-edit"),
    path("schedules/<int:schedule_id>/pause", schedule_views.schedule_pause, name="schedule-pause"),
    path("schedules/<int:schedule_id>/run", schedule_views.schedule_run, name="schedule-run"),
    path("schedules/<int:schedule_id>/delete", schedule_views.schedule_delete, name="schedule-delete"),
]
