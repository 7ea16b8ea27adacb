from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import include, path, re_path

from instances.views import gateway_view
from triggers.hooks import hook
from web import health, ops, views


def favicon(request: HttpRequest) -> HttpResponsePermanentRedirect:
    """For clients that ask for /favicon.ico without reading a page's <link rel="icon">."""
    return HttpResponsePermanentRedirect(static("console/favicon.svg"))  # hashed once collected


urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", health.healthz, name="healthz"),
    path("favicon.ico", favicon),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics, name="metrics"),
    re_path(r"^v1/hooks/(?P<trigger_id>[0-9]{1,18})$", hook, name="hook"),
    path("v1/", include("web.api_urls")),
    path("gateway/anthropic/v1/<path:route>", gateway_view, name="gateway-anthropic"),
    path("reviews/", include("reviews.urls")),
    path("login/once/<str:uidb64>/<str:token>/", views.login_once, name="login-once"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="/login/"), name="logout"),
    path("", include("triggers.urls")),
    path("", include("web.console_urls")),
]
