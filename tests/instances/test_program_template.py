"""The key-free `program` template (issue #26, item 12): anyone may start from it, and a run of it ends done (verified)."""

import pytest

from instances import services
from tests.loops.conftest import drive_in_thread

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_program_instance_runs_end_to_end_without_a_key(user, settings, tmp_path):
    settings.TETHER_WORKSPACES = tmp_path / "ws"
    # A person without the run_programs capability may create it: the template fixes the program.
    instance = services.instance_create(user=user, values={"name": "my first agent"}, template="program")
    assert instance.brain == "command" and instance.credential_id is None
    assert instance.command[:2] == ["sh", "-c"] and not instance.tools and not instance.model
    from loops import services as loop_services

    run = loop_services.run_start(instance=instance, user=user, objective="Say hello to the team.")
    run = drive_in_thread(run)
    assert (run.status, run.outcome, run.verified) == ("finished", "done", True), run.outcome_detail
    notes = (instance.workspace_path() / "NOTES.md").read_text()
    assert "Say hello to the team." in notes and "Iteration 1" in notes
