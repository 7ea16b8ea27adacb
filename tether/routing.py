"""Websocket routes."""

from django.urls import path

from web import consumers

websocket_urlpatterns: list = [
    path("ws/runs/<int:run_id>/", consumers.RunConsumer.as_asgi()),
    path("ws/fleet/", consumers.FleetConsumer.as_asgi()),
]
