"""The /v1/ routes: the apps' ninja Routers on one API (`web.rest.api`), and /v1/openapi.json.

Ids are `{id:...}`: 1 to 18 digits, so every id fits a 64-bit column. Anything else under /v1/
(a malformed id, an unknown route) answers a JSON 404, and a method a route does not take a
JSON 405 naming the allowed ones in `Allow`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, re_path, register_converter
from django.views.decorators.csrf import csrf_exempt
from ninja.responses import Response

from budgets.models import Price
from instances import api as instances_api
from instances import prices
from instances.models import AgentTemplate
from reviews import api as reviews_api
from triggers import api as triggers_api
from triggers import schedules_api
from web import api as loops_api
from web import rest
from web.auth import error


class IdConverter:
    """A whole number that fits a signed 64-bit integer (at most 18 digits)."""

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


register_converter(IdConverter, "id")

rest.api.add_router("", instances_api.router)
rest.api.add_router("", loops_api.router)
rest.api.add_router("", reviews_api.router)
rest.api.add_router("", triggers_api.router)
rest.api.add_router("", schedules_api.router)  # an instance's schedules, beside its triggers


def _json_405(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Answer a method the route does not take as the API's JSON error, keeping `Allow`."""

    @functools.wraps(view)
    def inner(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = view(request, *args, **kwargs)
        if response.status_code == 405 and not response.get("Content-Type", "").startswith(
            "application/json"
        ):
            allowed = response["Allow"]
            methods = " or ".join(m.strip() for m in allowed.split(","))
            response = error(f"method {request.method} is not allowed here; use {methods}", 405)
            response["Allow"] = allowed
        return response

    return inner


@csrf_exempt
def openapi(request: HttpRequest) -> HttpResponse:
    """Serve the document ninja generates from the routes' schemas, with today's usable templates and priced models."""

    if request.method not in ("GET", "HEAD"):
        response = error(f"method {request.method} is not allowed here; use GET", 405)
        response["Allow"] = "GET"
        return response
    spec = rest.api.get_openapi_schema(path_prefix="/v1")
    names = sorted(t.name for t in AgentTemplate.objects.all() if prices.template_usable(t))
    schemas = spec["components"]["schemas"]
    schemas["InstanceIn"]["properties"]["template"] = {
        "anyOf": [{"enum": names}, {"type": "null"}],
        "description": "a template's name; the other fields override it",
    }
    # An instance that calls Claude is refused a model without a price: the priced ones, or "" (the default).
    priced = ["", *sorted(set(Price.objects.values_list("model", flat=True)))]
    for body in ("InstanceIn", "InstanceChange"):
        schemas[body]["properties"]["model"] = {
            "anyOf": [{"enum": priced}, {"type": "null"}],
            "description": "a model with a price (Budgets → Prices); empty: the default model",
        }
    return Response(spec)




def _patterns() -> list[Any]:
    found: list[Any] = [path("openapi.json", openapi, name="openapi")]
    for pattern in rest.api.urls[0]:
        if not isinstance(pattern, URLPattern) or pattern.name in ("openapi-json", "api-root"):
            continue
        found.append(
            URLPattern(pattern.pattern, _json_405(pattern.callback), pattern.default_args, pattern.name)
        )
    # ninja reverses its root to learn where it is mounted; it answers like any unknown route.
    found.append(path("", rest.not_found, name="api-root"))
    found.append(re_path(r"^.*$", rest.not_found, name="not-found"))
    return found


app_name = "api"
urlpatterns = _patterns()
