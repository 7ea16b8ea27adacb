"""Bad input to /v1/ answers a JSON 4xx, never a 5xx or an HTML page."""

import json

import pytest
from django.test import Client

from instances.models import Instance
from instances.services import InstanceRefused
from loops import services as loop_services
from loops.models import Run
from tether.refusals import Refused
from triggers.services import TriggerRefused
from web.auth import make_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(django_user_model, tmp_path):
    user = django_user_model.objects.create_user("ada")
    headers = {"Authorization": f"Bearer {make_token(user)}"}
    instance = Instance.objects.create(owner=user, name="a", command=["true"], workspace=str(tmp_path / "w"),
                                       objective_max_chars=5)
    client = Client()

    def call(method, path, body=None, content_type="application/json", raw=None):
        data = raw if raw is not None else (json.dumps(body) if body is not None else "")
        return getattr(client, method)(path, data=data, content_type=content_type, headers=headers)

    call.instance = instance
    return call


def _json_error(response, status):
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/json"
    assert isinstance(response.json()["error"], str)


@pytest.mark.parametrize(
    "path",
    ["/v1/instances/abc", "/v1/instances/-1/loop", "/v1/instances/1.5/loop/2",
     "/v1/instances/" + "9" * 40 + "/loop/1", "/v1/instances/1/loop/" + "9" * 19 + "/receipt", "/v1/nothing"],
)
def test_malformed_ids_and_unknown_routes_are_json_404(api, path):
    _json_error(api("get", path), 404)
    _json_error(api("post", path, {}), 404)  # not a CSRF page either


def test_wrong_method_is_a_json_405_with_allow(api):
    response = api("delete", "/v1/pools")
    _json_error(response, 405)
    assert response["Allow"] == "GET"


@pytest.mark.parametrize(
    "body",
    [{"objective": "a\x00b"}, {"objective": "\ud800"}, {"objective": "ok", "max_minutes": 10**10},
     {"objective": "ok", "max_cost_usd": 1e30}, {"objective": "ok", "max_cost_usd": "1e30"},
     {"objective": "ok", "max_cost_usd": "\x00"}],
)
def test_unstorable_text_and_huge_numbers_are_400(api, body):
    _json_error(api("post", f"/v1/instances/{api.instance.pk}/loop", body), 400)
    assert not Run.objects.exists()


def test_deep_json_nan_and_nul_keys_are_400(api):
    url = f"/v1/instances/{api.instance.pk}/loop"
    _json_error(api("post", url, raw="[" * 100_000 + "]" * 100_000), 400)
    _json_error(api("post", url, raw=json.dumps({"objective": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["x"]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]})), 400)
    _json_error(api("post", url, raw='{"objective": "x", "max_cost_usd": NaN}'), 400)
    _json_error(api("post", url, raw='{"a\\u0000": 1}'), 400)


def test_oversized_body_is_413_and_other_content_types_415(api):
    url = f"/v1/instances/{api.instance.pk}/loop"
    _json_error(api("post", url, raw="x" * (10 * 1024 * 1024)), 413)
    _json_error(api("post", url, raw="--x\r\n", content_type="multipart/form-data"), 415)
    _json_error(api("post", url, raw="objective=go", content_type="application/x-www-form-urlencoded"), 415)


def test_crlf_counts_as_one_character_against_the_objective_cap(api):
    response = api("post", f"/v1/instances/{api.instance.pk}/loop", {"objective": "ab\r\ncd"})  # 5 with CRLF as one
    assert response.status_code == 201, response.content
    assert response.json()["objective"] == "ab\ncd"


def test_whole_floats_are_whole_numbers(api):
    response = api("post", f"/v1/instances/{api.instance.pk}/loop", {"objective": "go", "max_iterations": 2.0})
    assert response.status_code == 201 and response.json()["max_iterations"] == 2


def test_loop_decide_takes_null_as_the_default(api):
    response = api("post", f"/v1/instances/{api.instance.pk}/loop-decide",
                   {"objective": "go", "act_ok": None, "act_detail": None})
    assert response.status_code == 200 and response.json()["verdict"] == "done"


def test_openapi_lists_every_route_and_the_instance_schema_allows_its_id(api):
    from web.api_urls import urlpatterns

    spec = api("get", "/v1/openapi.json").json()
    documented = set(spec["paths"])
    routes = {
        "/v1/" + str(p.pattern).replace("<id:", "{").replace(">", "}")
        for p in urlpatterns
        if str(p.pattern) not in ("openapi.json", "^.*$", "")
    }
    assert routes == documented
    instance = spec["components"]["schemas"]["Instance"]
    assert "id" in instance["properties"] and "additionalProperties" not in instance
    fields = spec["components"]["schemas"]["InstanceIn"]["properties"]
    from instances.api import FIELDS

    assert set(fields) == set(FIELDS)


def test_the_document_names_only_templates_and_models_a_create_would_keep(api):
    from budgets.models import Price
    from instances.models import AgentTemplate

    def choices():
        fields = api("get", "/v1/openapi.json").json()["components"]["schemas"]["InstanceIn"]["properties"]
        return fields["template"]["anyOf"][0]["enum"], fields["model"]["anyOf"][0]["enum"]

    templates, models = choices()
    assert "coder" in templates and "claude-sonnet-5-5" in models and "" in models
    priced = AgentTemplate.objects.get(name="coder").model
    Price.objects.filter(model=priced).delete()  # the operator removes a price: its templates cannot be used
    templates, models = choices()
    assert "coder" not in templates and priced not in models
    refused = api("post", "/v1/instances", {"name": "c", "template": "coder"})
    assert refused.status_code == 400 and "no price" in refused.json()["error"]


def test_an_unknown_body_field_of_a_route_without_fields_and_a_bad_query_are_json_400(api):
    run = api("post", f"/v1/instances/{api.instance.pk}/loop", {"objective": "go"}).json()
    base = f"/v1/instances/{api.instance.pk}/loop/{run['id']}"
    answer = api("post", f"{base}/cancel", {"please": True})
    assert answer.status_code == 400 and answer.json() == {"error": "unknown field(s): please"}
    answer = api("get", f"{base}/events?after=x")
    assert answer.status_code == 400 and answer.json()["error"].startswith("after must be")
    assert api("post", f"{base}/cancel").status_code == 202  # no body at all is fine


def test_the_schemas_idea_of_blank_is_the_validators():
    """A pattern that let U+001E through while the validator strips it made a schema-valid body a 400."""
    import re
    import sys

    from tether.schema import NONBLANK, SOMETHING, clean_text

    spaces = {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()}
    for c in spaces | {"\ufeff", "a", "\u200b", "\x1b"}:
        blank_by_pattern = re.fullmatch(NONBLANK, c) is None
        assert blank_by_pattern == (c in spaces), repr(c)
        assert (re.search(SOMETHING, c) is None) == (c in spaces), repr(c)
        try:
            clean_text(c, nonblank=True)
            blank_by_validator = False
        except ValueError:
            blank_by_validator = True
        assert blank_by_validator == blank_by_pattern, repr(c)


def test_an_interjection_of_only_a_separator_character_is_a_blank_400(api):
    from loops import services

    instance = api.instance
    run = services.run_start(instance=instance, user=instance.owner, objective="hi")
    for blank in ("\x1e", " \x85\u3000"):
        response = api("post", f"/v1/instances/{instance.pk}/loop/{run.pk}/interject", {"message": blank})
        _json_error(response, 400)
        assert "message" in response.json()["error"]
    assert not run.interjections.exists()


def test_the_kept_invisible_class_is_what_the_walk_over_every_code_point_finds():
    """The schema's character class is kept for one Unicode version (the walk costs a second per
    process); for that version it must be exactly what the walk finds, and any other version walks."""
    import unicodedata

    from tether import schema

    version, kept = schema._KNOWN_CLASS
    assert kept == schema._invisible_class() or unicodedata.unidata_version != version
    assert schema.INVISIBLE_CLASS == schema._invisible_class()



@pytest.mark.parametrize("kind", [Refused, loop_services.Refused, InstanceRefused, TriggerRefused])
def test_a_refusal_a_route_lets_through_is_answered_with_its_status_and_field(api, monkeypatch, kind):
    def refuse(user):
        raise kind("the pools are being counted; try again", 409, "pool")

    monkeypatch.setattr("web.api.pools_visible_to", refuse)
    response = api("get", "/v1/pools")
    _json_error(response, 409)
    assert response.json() == {"error": "the pools are being counted; try again", "field": "pool"}
