"""A model with no price is refused, never guessed: at save (API and admin) and at run start.

An instance that calls Claude (the `anthropic` brain, or the `llm` decider) needs a price row
for the model it really calls: its own, else the default. A refusal is a 4xx with a message
naming the model and how to add a price, and saves nothing.
"""

import json

import pytest
from django.contrib.auth.models import Permission

from budgets import selectors
from budgets.models import Price
from budgets.pricing import UnpricedModel
from instances.brains.anthropic.config import model_for
from instances.models import AgentTemplate, Credential, Instance
from instances.prices import ensure_priced
from loops import services
from loops.models import Run
from web.auth import make_token

pytestmark = pytest.mark.django_db

UNPRICED = "claude-mystery-9"
KEY = "sk-ant-api03-PRICETESTKEY-0123456789abcdefWXYZ"


def grant(user):
    user.user_permissions.add(Permission.objects.get(codename="run_programs", content_type__app_label="instances"))
    return type(user).objects.get(pk=user.pk)


@pytest.fixture
def api(client, user):
    token = make_token(user)

    def call(method, path, body=None):
        return getattr(client, method)(
            path, data=json.dumps(body), content_type="application/json", headers={"Authorization": f"Bearer {token}"}
        )

    return call


def assert_refused_for_price(response, model=UNPRICED, status=400):
    assert response.status_code == status, response.content
    message = response.json()["error"]
    assert f"model {model!r}, which has no price" in message
    assert "Budgets → Prices" in message


# --- the price table ---------------------------------------------------------------------


def test_a_fresh_install_prices_the_default_model_and_every_shipped_template():
    default = model_for(Instance(brain="anthropic"))
    assert Price.objects.for_model(default) is not None, default
    models = {t.model for t in AgentTemplate.objects.all() if t.model}
    assert {"claude-sonnet-5-5", "claude-haiku-5-5"} <= models
    for model in models:
        family = "claude-haiku-4-5" if "haiku" in model else "claude-sonnet-4-5"
        rates, expected = selectors.price_for_model(model), selectors.price_for_model(family)
        assert rates.model == model, f"{model} is priced by its own row, not a guess"
        assert (rates.input_usd_per_mtok, rates.output_usd_per_mtok, rates.cache_write_usd_per_mtok,
                rates.cache_read_usd_per_mtok) == (expected.input_usd_per_mtok, expected.output_usd_per_mtok,
                                                   expected.cache_write_usd_per_mtok, expected.cache_read_usd_per_mtok)


def test_an_unknown_model_is_an_error_not_the_dearest_guess():
    with pytest.raises(UnpricedModel, match=f"Model '{UNPRICED}' has no price.*Budgets → Prices"):
        selectors.price_for_model(UNPRICED)


def test_tokens_already_spent_on_an_unpriced_model_are_settled_at_the_dearest_rates():
    from instances.brains.base import Usage

    # Settlement cannot refuse (the money is spent): the one place a guess remains, and it is the dearest.
    cost = selectors.usage_cost(Usage(model=UNPRICED, input_tokens=1_000_000))
    assert cost == 15_000_000


# --- the API -----------------------------------------------------------------------------


def test_the_api_refuses_a_template_instance_with_an_unpriced_model(api):
    response = api("post", "/v1/instances", {"name": "a", "template": "coder", "model": UNPRICED})
    assert_refused_for_price(response)
    assert f"Instance 'a' calls Claude with model '{UNPRICED}'" in response.json()["error"]
    assert not Instance.objects.exists()


def test_the_api_refuses_a_hand_made_instance_with_an_unpriced_model(api, user):
    grant(user)
    for body in (
        {"name": "b", "brain": "anthropic", "model": UNPRICED},
        {"name": "c", "command": ["true"], "decider": "llm", "model": UNPRICED},  # the decider calls Claude
    ):
        assert_refused_for_price(api("post", "/v1/instances", body))
    assert not Instance.objects.exists()


def test_the_api_refuses_an_instance_whose_default_model_has_no_price(api, user, settings):
    grant(user)
    settings.TETHER_ANTHROPIC_DEFAULT_MODEL = UNPRICED
    assert_refused_for_price(api("post", "/v1/instances", {"name": "d", "brain": "anthropic"}))
    assert_refused_for_price(api("post", "/v1/instances", {"name": "d", "template": "coder", "model": ""}))
    assert not Instance.objects.exists()


def test_the_api_saves_priced_models_and_instances_that_never_call_claude(api, user):
    assert api("post", "/v1/instances", {"name": "e", "template": "coder"}).status_code == 201
    priced = api("post", "/v1/instances", {"name": "f", "template": "coder", "model": "claude-haiku-4-5-20251001"})
    assert priced.status_code == 201, priced.content
    grant(user)
    plain = api("post", "/v1/instances", {"name": "g", "command": ["true"], "model": UNPRICED})
    assert plain.status_code == 201, plain.content  # a command brain judged by checks calls no model
    assert sorted(Instance.objects.values_list("name", flat=True)) == ["e", "f", "g"]


# --- admin -------------------------------------------------------------------------------


@pytest.fixture
def staff(django_user_model):
    person = django_user_model.objects.create_user("pat", password="pw-pat-123", is_staff=True)
    person.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="instances", codename__in=["add_instance", "change_instance", "view_instance"]
        )
    )
    return grant(person)


def admin_form(owner, **fields):
    data = {
        "owner": owner.pk, "name": "via-admin", "brain": "anthropic", "decider": "checks", "max_iterations": 3,
        "workspace": "", "model": "", "system_prompt": "", "base_url": "", "tools": "[]", "command_allow": "[]",
        "command_deny": "[]", "approval_tools": "[]", "max_tool_turns": 20, "max_output_tokens": 16000,
        "tool_timeout_seconds": 120, "act_timeout_seconds": 600, "objective_max_chars": 8000,
        "command": "[]", "env": "{}", "checks": "[]", "protected_paths": "[]",
    }
    data.update(fields)
    return data


def test_admin_refuses_an_unpriced_model_and_saves_nothing(client, staff):
    client.force_login(staff)
    answer = client.post("/admin/instances/instance/add/", admin_form(staff, model=UNPRICED))
    assert answer.status_code == 400
    page = answer.content.decode()
    assert f"model &#x27;{UNPRICED}&#x27;, which has no price" in page and "Budgets → Prices" in page
    assert not Instance.objects.exists()


def test_admin_refuses_changing_an_instance_to_an_unpriced_model(client, staff):
    kept = Instance.objects.create(owner=staff, name="kept", brain="anthropic", model="claude-sonnet-4-5")
    client.force_login(staff)
    answer = client.post(f"/admin/instances/instance/{kept.pk}/change/", admin_form(staff, name="kept", model=UNPRICED))
    assert answer.status_code == 400
    kept.refresh_from_db()
    assert kept.model == "claude-sonnet-4-5"


def test_admin_saves_a_priced_model_and_a_blank_one(client, staff):
    client.force_login(staff)
    for name, model in (("priced", "claude-sonnet-4-5"), ("default", "")):
        answer = client.post("/admin/instances/instance/add/", admin_form(staff, name=name, model=model))
        assert answer.status_code == 302, answer.content.decode()[:2000]
    assert sorted(Instance.objects.values_list("name", flat=True)) == ["default", "priced"]


# --- run start ---------------------------------------------------------------------------


def test_a_run_cannot_start_on_an_unpriced_model(user, make_instance, api):
    # Saved before its price went away (or by code that skips the checks): refused at start all the same.
    credential = Credential.create_for(user, label="mine", secret=KEY)
    instance = make_instance(user, brain="anthropic", model=UNPRICED, credential=credential, command=[])
    with pytest.raises(services.Refused, match=f"model '{UNPRICED}', which has no price.*Budgets → Prices"):
        services.run_start(instance=instance, user=user, objective="go")
    # The body is fine; the instance cannot run until its model has a price again: a conflict.
    assert_refused_for_price(api("post", f"/v1/instances/{instance.pk}/loop", {"objective": "go"}), status=409)
    assert not Run.objects.exists()


# --- caps typed in dollars ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("cap", "message"),
    [
        (0.0000001, "at least 0.01"),  # once a run with a $0 cap
        (0.000001, "at least 0.01"),  # a cap below a cent is refused, not kept
        ("0.0000001", "must be a number of US dollars"),
        ("1.0000001", "must be a number of US dollars"),  # text is exact: at most six decimal places
        ("1e30", "more than Tether counts"),
        (1e30, "more than Tether counts"),
        (1_000_000.01, "more than Tether counts"),
        ("NaN", "must be a number of US dollars"),
        (0, "more than 0 dollars"),
    ],
)
def test_a_cap_out_of_bounds_is_a_400(api, user, make_instance, cap, message):
    instance = make_instance(user)
    response = api("post", f"/v1/instances/{instance.pk}/loop", {"objective": "go", "max_cost_usd": cap})
    assert response.status_code == 400, response.content
    assert message in response.json()["error"]
    assert response.json()["field"] == "max_cost_usd"
    assert not Run.objects.exists()


@pytest.mark.parametrize(("cap", "kept"), [(0.01, "0.010000"), ("0.123456", "0.123456"), (1_000_000, "1000000.000000")])
def test_a_cap_within_bounds_is_kept_exactly(api, user, make_instance, cap, kept):
    instance = make_instance(user)
    response = api("post", f"/v1/instances/{instance.pk}/loop", {"objective": "go", "max_cost_usd": cap})
    assert response.status_code == 201, response.content
    assert response.json()["max_cost_usd"] == kept
    assert Run.objects.get().max_cost_micros == round(float(kept) * 1_000_000)


def test_a_command_agent_judged_with_its_own_judge_model_needs_no_price_for_its_model(user, price):
    """Its only Claude call is the judge, with `judge_model`: its `model` (the default) is never called."""
    Price.objects.exclude(pk=price.pk).delete()  # the default model unpriced, as after a flush
    judged = Instance(owner=user, name="judged", brain="command", command=["true"], judge_rubric="names it",
                      judge_model=price.model)
    ensure_priced(judged)  # nothing to refuse
    judged.judge_model = ""  # now the judge calls with the instance's model, the unpriced default
    with pytest.raises(UnpricedModel) as refused:
        ensure_priced(judged)
    assert refused.value.field == "model" and model_for(judged) in str(refused.value)
