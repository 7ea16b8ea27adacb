"""The console's trigger pages (namespace `triggers`)."""

from django.urls import path

from triggers import views

app_name = "triggers"

urlpatterns = [
    path("instances/<int:instance_id>/triggers/", views.trigger_list, name="list"),
    path("triggers/<int:trigger_id>/rotate", views.trigger_rotate, name="rotate"),
    path("triggers/<int:trigger_id>/pause", views.trigger_pause, name="pause"),
    path("triggers/<int:trigger_id>/delete", views.trigger_delete, name="delete"),
]
