"""Where the money went: per iteration and per call on the run page, in the API, the receipt and the admin.

A metered run is driven for real: Claude is played by the local Messages server, which
reports the usage scripted here, and every call settles through the runner's meter. An
overdrawn run is a command agent that reports $50 against its $0.05 reservation.
"""

import re
from html import unescape

import pytest
from django.urls import reverse

from budgets import limits
from budgets import services as budget_services
from budgets.models import Pool, Reservation
from budgets.money import format_usd
from instances.models import Credential
from loops import services
from tests.fakes.messages_server import MessagesServer, text, tool_use
from tests.loops.conftest import drive_in_thread
from web.auth import make_token

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "sk-ant-api03-MONEYTRAILTESTKEY-0123456789abcdefWXYZ"
USAGES = [
    {"input_tokens": 1200, "output_tokens": 80, "cache_creation_input_tokens": 300, "cache_read_input_tokens": 900},
    {"input_tokens": 1500, "output_tokens": 120, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
    {"input_tokens": 1800, "output_tokens": 40, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 1200},
]
LIAR = """
json.dump({'cost_usd': 50}, open(os.environ['TETHER_USAGE_FILE'], 'w'))
print('spent a lot')
"""


def api_get(client, user, path):
    return client.get(path, headers={"Authorization": f"Bearer {make_token(user)}"})


def call_items(page):
    """Return {"iteration.call": text of its row, with its classes} from the run page."""
    found = {}
    for classes, key, body in re.findall(r'<li class="(call[^"]*)" data-call="([\d.]+)">(.*?)</li>', page, re.S):
        found[key] = (classes, " ".join(unescape(re.sub(r"<[^>]+>", " ", body)).split()))
    return found


@pytest.fixture
def metered_run(user, make_instance, price):
    """A finished Claude run of one iteration: two tool turns and a final answer, three metered calls."""
    with MessagesServer(api_key=KEY) as server:
        credential = Credential.create_for(user, label="mine", secret=KEY)
        inst = make_instance(
            user, name="scribe", brain="anthropic", decider="checks", base_url=server.url, credential=credential,
            model="claude-test-1", tools=["list_files"], command=[], checks=[], max_iterations=1,
        )
        inst.workspace_path().mkdir(parents=True, exist_ok=True)
        server.enqueue(
            tool_use("list_files", {"path": "."}, say="looking", usage=USAGES[0]),
            tool_use("list_files", {"path": "."}, usage=USAGES[1]),
            text("done", usage=USAGES[2]),
        )
        run = drive_in_thread(services.run_start(instance=inst, user=user, objective="look", max_cost_usd="1.00"))
        assert server.calls == 3
    return run


@pytest.fixture
def overdrawn_run(user, make_instance, script, settings):
    settings.TETHER_COMMAND_ITERATION_RESERVE_USD = "0.05"
    inst = make_instance(user, name="liar", command=script(LIAR), checks=[], max_iterations=5)
    run = services.run_start(instance=inst, user=user, objective="spend", max_cost_usd="0.20")
    budget_services.open_run_pools(run)
    limits.set_limit(budget_services.instance_pool(inst), 1_000_000, "admin")
    run = drive_in_thread(run)
    assert run.outcome == "budget_exhausted"
    return run


def test_a_metered_run_shows_each_calls_model_tokens_cost_and_payers_on_the_page(client, user, metered_run):
    calls = list(Reservation.objects.filter(run_id=metered_run.pk, call__gt=0).order_by("call"))
    assert [r.call for r in calls] == [1, 2, 3]
    run_pool = Pool.objects.get(kind="run", run=metered_run)
    assert calls[0].chain == [run_pool.pk]  # a call holds money in its run pool alone (its lease) ...
    chain = " › ".join(p.name for p in Pool.objects.filter(pk__in=run_pool.chain_ids()).order_by("path"))
    assert chain.count("›") == 3  # ... and root › user › instance › run all pay: every pool, root first
    client.force_login(user)
    page = client.get(f"/runs/{metered_run.pk}/").content.decode()
    assert "Where the money went" in page
    rows = call_items(page)
    for r, usage in zip(calls, USAGES, strict=True):
        classes, row = rows[f"1.{r.call}"]
        assert "overdraft" not in classes
        assert f"call {r.call}" in row and "claude-test-1" in row
        assert f"{usage['input_tokens']:,} in · {usage['output_tokens']:,} out" in row
        written, read = usage["cache_creation_input_tokens"], usage["cache_read_input_tokens"]
        assert (f"cache {written:,} written, {read:,} read" in row) == bool(written or read)
        assert r.actual > 0 and f"{format_usd(r.actual)} of {format_usd(r.amount)} reserved" in row
        assert f"paid by {chain}" in row
    total = sum(r.actual for r in calls)
    summary = re.search(r"<summary><span class=\"cost-title\">Iteration 1</span>(.*?)</summary>", page, re.S)
    assert format_usd(total) in summary.group(1) and "3 model calls</small>" in summary.group(1)
    # The headroom of the chain beside it: each pool's limit, spent, held and what is left; the run's cap limits.
    run_pool = Pool.objects.get(kind="run", run=metered_run)
    assert f"{format_usd(run_pool.spent)} spent · $0.00 held · {format_usd(1_000_000 - run_pool.spent)} left of $1.00" in page
    assert re.search(r'<li class="pool limiting[^"]*">\s*<div class="pool-head"><span class="pool-name">'
                     + re.escape(run_pool.name), page)


def test_a_metered_run_in_the_costs_api_and_the_receipt(client, user, metered_run):
    calls = list(Reservation.objects.filter(run_id=metered_run.pk, call__gt=0).order_by("call"))
    response = api_get(client, user, f"/v1/instances/{metered_run.instance_id}/loop/{metered_run.pk}/costs")
    assert response.status_code == 200
    body = response.json()
    assert body["spent_micros"] == metered_run.spent_micros == sum(r.actual for r in calls)
    (iteration,) = body["iterations"]
    assert iteration["iteration"] == 1 and iteration["cost_micros"] == metered_run.spent_micros
    metered = [c for c in iteration["calls"] if c["kind"] == "metered"]
    assert [c["call"] for c in metered] == [1, 2, 3]
    for got, r, usage in zip(metered, calls, USAGES, strict=True):
        assert got["model"] == "claude-test-1"
        assert got["tokens"] == {
            "input": usage["input_tokens"],
            "output": usage["output_tokens"],
            "cache_write": usage["cache_creation_input_tokens"],
            "cache_read": usage["cache_read_input_tokens"],
        }
        assert (got["reserved_micros"], got["settled_micros"], got["overdraft_micros"]) == (r.amount, r.actual, 0)
        assert got["overdraft_cause"] is None
        assert [p["kind"] for p in got["paid_by"]] == ["root", "user", "instance", "run"]
    assert body["budget"]["pools"][-1]["spent"] == metered_run.spent_micros
    assert body["earlier"] is None
    assert KEY not in response.content.decode()
    receipt = client.get(
        f"/v1/instances/{metered_run.instance_id}/loop/{metered_run.pk}/receipt",
        headers={"Authorization": f"Bearer {make_token(user)}"},
    ).json()["receipt"]
    (model,) = [m for m in receipt["cost"]["by_model"] if m["model"] == "claude-test-1"]
    assert model["calls"] == 3
    assert model["tokens"]["input"] == sum(u["input_tokens"] for u in USAGES)
    assert model["tokens"]["cache_read"] == 2100 and model["tokens"]["cache_write"] == 300


def test_an_overdraft_is_shown_in_red_with_its_cause(client, user, overdrawn_run, settings):
    client.force_login(user)
    page = client.get(f"/runs/{overdrawn_run.pk}/").content.decode()
    classes, row = call_items(page)["1.0"]
    assert "overdraft" in classes.split()
    assert "reported spend" in row and "$50.00 of $0.05 reserved" in row
    assert "Overdraft $49.95: the agent reported $50.00 against $0.05 reserved" in row
    instance_pool = Pool.objects.get(kind="instance", instance=overdrawn_run.instance)
    assert f"{instance_pool.name} went over its limit by $49.00" in row
    assert re.search(r'<details class="cost-iteration overdraft" id="run-\d+-cost-1" data-keep open>', page)
    css = (settings.BASE_DIR / "static/console/console.css").read_text()
    assert re.search(r"\.call\.overdraft[^{]*\{[^}]*var\(--bad", css)  # red
    body = api_get(client, user, f"/v1/instances/{overdrawn_run.instance_id}/loop/{overdrawn_run.pk}/costs").json()
    (reported,) = [c for c in body["iterations"][0]["calls"] if c["call"] == 0]
    assert reported["kind"] == "reported" and reported["overdraft_micros"] == 49_950_000
    assert reported["overdraft_cause"].startswith("the agent reported $50.00 against $0.05 reserved")


def test_a_run_within_its_reservations_has_no_overdraft_row(client, user, metered_run):
    client.force_login(user)
    page = client.get(f"/runs/{metered_run.pk}/").content.decode()
    assert "Overdraft" not in page and 'class="call overdraft"' not in page


def test_another_users_run_is_404_on_the_page_the_earlier_page_and_the_api(client, other_user, metered_run):
    client.force_login(other_user)
    assert client.get(f"/runs/{metered_run.pk}/").status_code == 404
    assert client.get(f"/runs/{metered_run.pk}/costs?before=5").status_code == 404
    response = api_get(client, other_user, f"/v1/instances/{metered_run.instance_id}/loop/{metered_run.pk}/costs")
    assert response.status_code == 404 and "not found" in response.json()["error"]
    assert "claude-test-1" not in response.content.decode()


# --- many iterations and calls: bounded pages and queries ---------------------------------------------


def trail(run, iterations, calls):
    """Record a run's money trail as the meter leaves it: `calls` settled calls per iteration, one overdrawn."""
    from django.db import transaction

    chain_ids = budget_services.open_run_pools(run).chain_ids()
    rows = [
        Reservation(
            run_id=run.pk, iteration=n, call=c, model="claude-test-1", status="settled", chain=chain_ids,
            usage={"input_tokens": 1000 + c, "output_tokens": 50, "cache_write_tokens": 0, "cache_read_tokens": 0},
            amount=2000, actual=1500,
        )
        for n in range(1, iterations + 1)
        for c in range(1, calls + 1)
    ]
    rows.append(Reservation(run_id=run.pk, iteration=iterations, call=0, status="settled", chain=chain_ids,
                            amount=50_000, actual=90_000, overdraft=40_000))
    with transaction.atomic():
        Reservation.objects.bulk_create(rows, batch_size=500)


def test_the_page_draws_the_latest_iterations_and_earlier_ones_on_demand(client, user, make_instance):
    inst = make_instance(user, name="busy")
    run = services.run_start(instance=inst, user=user, objective="a long run", max_iterations=1000)
    trail(run, iterations=35, calls=4)
    client.force_login(user)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    shown = [int(n) for n in re.findall(r'id="run-\d+-cost-(\d+)"', page)]
    assert shown == list(range(35, 25, -1))
    seen, chunks = shown, 0
    while (link := re.search(r'hx-get="([^"]*/costs\?before=(\d+))"', page)) is not None:
        assert int(link.group(2)) == seen[-1]
        page = client.get(link.group(1), headers={"HX-Request": "true"}).content.decode()
        assert "<html" not in page
        earlier = [int(n) for n in re.findall(r'id="run-\d+-cost-(\d+)"', page)]
        assert " open" not in re.findall(r"<details[^>]*>", page)[0]
        seen, chunks = seen + earlier, chunks + 1
    assert seen == list(range(35, 0, -1)) and chunks == 3
    assert client.get(f"/runs/{run.pk}/costs?before=x").status_code == 400
    assert client.get(f"/runs/{run.pk}/costs?before=0").status_code == 400
    # The API pages the same way, and refuses a bad page with a JSON 400.
    url = f"/v1/instances/{inst.pk}/loop/{run.pk}/costs"
    first = api_get(client, user, url).json()
    assert [it["iteration"] for it in first["iterations"]] == list(range(35, 25, -1))
    assert first["iterations"][0]["overdraft_micros"] == 40_000 and first["earlier"] == 26
    older = api_get(client, user, f"{url}?before=26").json()
    assert older["iterations"][0]["iteration"] == 25 and len(older["iterations"][0]["calls"]) == 4
    bad = api_get(client, user, f"{url}?before=-3")
    assert bad.status_code == 400 and "before must be" in bad.json()["error"]
    assert api_get(client, user, f"{url}?before=99999999999999999999").status_code == 400


def test_run_page_query_count_does_not_grow_with_iterations_or_calls(
    client, user, make_instance, django_assert_max_num_queries
):
    client.force_login(user)
    small = services.run_start(instance=make_instance(user, name="small"), user=user, objective="x")
    trail(small, iterations=3, calls=2)
    with django_assert_max_num_queries(15) as few:  # the page's own reads, the headroom, three for the money
        client.get(f"/runs/{small.pk}/")
    big = services.run_start(instance=make_instance(user, name="big"), user=user, objective="x", max_iterations=1000)
    trail(big, iterations=300, calls=40)
    with django_assert_max_num_queries(len(few.captured_queries)):
        page = client.get(f"/runs/{big.pk}/").content.decode()
    # At most the latest 10 iterations, and at most 300 call rows, whatever the run's size.
    assert len(re.findall(r'id="run-\d+-cost-\d+"', page)) == 10
    assert 0 < len(call_items(page)) <= 300
    assert "more not shown here" in page  # the calls a page leaves out are counted, and the JSON has them


# --- admin ----------------------------------------------------------------------------------------------


def test_the_reservation_admin_lists_calls_and_highlights_and_filters_overdrafts(admin_client, overdrawn_run):
    from budgets.models import Reservation as R

    metered = R.objects.create(
        run_id=overdrawn_run.pk, iteration=9, call=1, model="claude-test-1", status="settled", amount=3000,
        actual=2500, usage={"input_tokens": 1234, "output_tokens": 56, "cache_write_tokens": 7, "cache_read_tokens": 8},
    )
    changelist = reverse("admin:budgets_reservation_changelist")
    # This run's rows (search by run id), whatever other tests left in the table.
    listing = admin_client.get(f"{changelist}?q={overdrawn_run.pk}").content.decode()
    assert "claude-test-1" in listing and "1,234 / 56 / 7 / 8" in listing
    # Plain name before collectstatic, hashed after (a `serve` started by an earlier test may have collected).
    assert re.search(r"budgets/admin(\.[0-9a-f]{12})?\.css", listing)
    overdrawn = admin_client.get(f"{changelist}?q={overdrawn_run.pk}&overdrawn=yes").content.decode()
    assert '<strong class="overdraft">$49.95</strong>' in overdrawn and "1,234 / 56" not in overdrawn
    within = admin_client.get(f"{changelist}?q={overdrawn_run.pk}&overdrawn=no").content.decode()
    assert "1,234 / 56" in within and "$49.95" not in within
    reported = R.objects.get(run_id=overdrawn_run.pk, iteration=1, call=0)
    detail = admin_client.get(reverse("admin:budgets_reservation_change", args=[reported.pk])).content.decode()
    assert "the agent reported $50.00 against $0.05 reserved" in unescape(detail)
    assert Pool.objects.get(kind="instance", instance=overdrawn_run.instance).name in detail
    # Read-only: nothing in it can be changed or removed.
    assert 'name="_save"' not in detail
    assert admin_client.post(reverse("admin:budgets_reservation_change", args=[metered.pk]), {"amount": 1}).status_code == 403
    assert admin_client.post(reverse("admin:budgets_reservation_delete", args=[metered.pk]), {"post": "yes"}).status_code == 403
    assert R.objects.filter(pk=metered.pk, amount=3000).exists()
