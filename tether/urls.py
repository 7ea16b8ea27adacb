from django.contrib import admin
from django.urls import include, path

from loops import health

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", health.healthz, name="healthz"),
    path("v1/", include("loops.api_urls")),
]
