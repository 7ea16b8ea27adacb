from django.urls import path

from instances import api as instances_api
from loops import api, openapi
from reviews import views as reviews_views

app_name = "api"

urlpatterns = [
    path("openapi.json", openapi.document, name="openapi"),
    path("instances", instances_api.instances, name="instances"),
    path("credentials", instances_api.credentials, name="credentials"),
    path("pools", api.pools, name="pools"),
    path("credentials/<int:credential_id>", instances_api.credential_detail, name="credential-detail"),
    path("instances/<int:instance_id>", instances_api.instance_detail, name="instance-detail"),
    path("instances/<int:instance_id>/loop", api.loop, name="loop"),
    path("instances/<int:instance_id>/loop-decide", api.loop_decide, name="loop-decide"),
    path("instances/<int:instance_id>/loop/<int:run_id>", api.run_detail, name="run-detail"),
    path("instances/<int:instance_id>/loop/<int:run_id>/cancel", api.run_cancel, name="run-cancel"),
    path("instances/<int:instance_id>/loop/<int:run_id>/interject", api.run_interject, name="run-interject"),
    path("instances/<int:instance_id>/loop/<int:run_id>/resume", api.run_resume, name="run-resume"),
    path("instances/<int:instance_id>/loop/<int:run_id>/close", api.run_close, name="run-close"),
    path("instances/<int:instance_id>/loop/<int:run_id>/events", api.run_events, name="run-events"),
    path("instances/<int:instance_id>/loop/<int:run_id>/receipt", reviews_views.receipt, name="run-receipt"),
]
