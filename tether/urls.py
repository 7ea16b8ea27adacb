from django.contrib import admin
from django.urls import include, path

from loops import health, views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", health.healthz, name="healthz"),
    path("v1/", include("loops.api_urls")),
    path("login/once/<str:uidb64>/<str:token>/", views.login_once, name="login-once"),
]
