"""`delegate` on Tether's MCP server at `/mcp`: an agent's tool, taken with its per-act token only.

With a person's API token it is listed and refused (start_run is theirs). With a running
`command` agent's per-act token, `/mcp` relays the request to the act's own endpoint on the
worker that runs it (here, this test process, which drives the run in a thread): the token
reaches `delegate` and `get_run` for that act and nothing else, and dies with the act.
"""

import anyio
import pytest

from loops import services
from loops.models import Run
from tests.browser.conftest import Server, log_tail
from tests.loops.conftest import Background
from tests.support.cluster import wait_for
from tests.support.mcp import TOOLS, call, http_client, refused
from web.auth import make_token

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Hands its token over (as a leaked token would be), then holds its act open until told to end.
HOLDER = """
pathlib.Path('token.txt').write_text(os.environ['TETHER_TOKEN'])
for _ in range(1200):
    if pathlib.Path('go').exists():
        break
    time.sleep(0.05)
print('ending my act')
"""


@pytest.fixture
def server(tmp_path):
    started = Server(tmp_path)
    yield started
    started.stop()
    print(f"--- daphne log (tail) ---\n{log_tail(started.log_path)}")  # shown when the test fails


def test_a_persons_token_is_refused_delegate_with_a_clear_message(server, user, make_instance):
    make_instance(user, name="helper")
    token = make_token(user)

    async def session():
        async with http_client(server.url, token) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert TOOLS <= names and "delegate" in names
            said = await refused(client, "delegate", to="helper", objective="x", max_cost_usd="0.10")
            assert "per-act token" in said and "start_run" in said

    anyio.run(session)
    assert not Run.objects.exists()


def test_an_act_token_at_mcp_reaches_its_own_act_only_and_dies_with_it(
    server, user, other_user, make_instance, script
):
    make_instance(user, name="helper")
    theirs = services.run_start(
        instance=make_instance(other_user, name="theirs"), user=other_user, objective="no"
    )
    lead = make_instance(user, name="lead", command=script(HOLDER), tools=["delegate"], max_iterations=2)
    run = services.run_start(instance=lead, user=user, objective="delegate", max_cost_usd="1.00")
    driver = Background(run).start()
    token_file = lead.workspace_path() / "token.txt"
    token = wait_for(lambda: token_file.exists() and token_file.read_text(), 60, "the agent's token")

    async def during_the_act():
        async with http_client(server.url, token) as client:
            names = sorted(tool.name for tool in (await client.list_tools()).tools)
            assert names == ["delegate", "get_run"]
            assert "not found" in await refused(client, "get_run", run_id=theirs.pk)
            assert "Unknown tool" in await refused(client, "start_run", instance="helper", objective="escape")
            assert "does not fit" in await refused(
                client, "delegate", to="helper", objective="x", max_cost_usd=9
            )
            accepted = await call(client, "delegate", to="helper", objective="help", max_cost_usd=0.25)
            assert accepted["accepted"] is True

    anyio.run(during_the_act)
    (lead.workspace_path() / "go").write_text("")
    driver.join(60)
    run.refresh_from_db()
    assert run.status == "waiting" and run.delegation["state"] == "waiting", run.outcome_detail
    (child,) = Run.objects.filter(parent=run)
    assert (child.objective, child.max_cost_micros) == ("help", 250_000)
    assert not Run.objects.filter(objective="escape").exists()

    async def after_the_act():
        import httpx2

        async with httpx2.AsyncClient(timeout=30) as http:
            answer = await http.post(
                f"{server.url}/mcp",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"},
            )
        assert answer.status_code == 401 and "dies when its act ends" in answer.json()["error"]

    anyio.run(after_the_act)
