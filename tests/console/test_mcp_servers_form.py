"""Enabling MCP servers on an instance in the console: only the servers an operator granted you."""

import pytest

from instances.models import AgentTemplate, Instance, McpServer
from tests.console.test_instance_config import input_names, safe_post

pytestmark = pytest.mark.django_db


def test_the_form_offers_the_servers_granted_to_you_and_saves_the_ones_ticked(signed_in, user):
    McpServer.objects.create(name="notes", command=["/opt/mcp/notes"], description="team notes").users.add(
        user
    )
    McpServer.objects.create(name="secret-ops", command=["/opt/mcp/ops"])
    template = AgentTemplate.objects.get(name="coder")
    page = signed_in.get("/instances/new/coder/")
    assert "mcp_servers" in input_names(page)
    text = page.content.decode()
    assert "notes: team notes" in text and "secret-ops" not in text

    made = signed_in.post("/instances/new/coder/", safe_post(template, mcp_servers=["notes"]))
    assert made.status_code == 302, made.content.decode()[:2000]
    assert Instance.objects.get(owner=user).mcp_servers == ["notes"]


def test_a_server_not_granted_posted_by_hand_is_refused_and_nothing_saved(signed_in, user):
    McpServer.objects.create(name="secret-ops", command=["/opt/mcp/ops"])
    template = AgentTemplate.objects.get(name="coder")
    page = signed_in.get("/instances/new/coder/")
    assert "mcp_servers" not in input_names(page)  # nothing granted: nothing shown
    refused = signed_in.post("/instances/new/coder/", safe_post(template, mcp_servers=["secret-ops"]))
    assert refused.status_code == 400 and not Instance.objects.exists()
