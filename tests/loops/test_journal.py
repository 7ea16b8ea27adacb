"""The journal of tool calls: keys, replay, one start per key, and its rows leave with their run."""

import pytest

from instances.brains.base import JournalError
from loops import journal
from loops.models import ToolCall

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(user, make_instance, start):
    return start(make_instance(user))


def test_a_call_is_journaled_before_and_after_and_replayed(run):
    first = journal.ToolJournal(run.pk, 2, 1)
    content = [{"type": "text", "text": "writing"}, {"type": "tool_use", "id": "t1", "name": "write_file", "input": {}}]
    key = first.started(1, 0, {"id": "t1", "name": "write_file", "input": {}}, content)
    assert key == f"r{run.pk}-i2-t1-c0"
    assert journal.calls_of(run.pk, 2) == [
        {"name": "write_file", "key": key, "state": "started", "is_error": False, "attempt": 1}
    ]
    first.finished(key, "wrote a.txt", False)
    second = first.started(1, 1, {"id": "t2", "name": "run_command", "input": {}}, content)
    turns = journal.ToolJournal(run.pk, 2, 2).replay()
    assert list(turns) == [1]
    assert turns[1].content == content
    assert turns[1].calls[0].finished and turns[1].calls[0].result == "wrote a.txt"
    assert turns[1].calls[1].key == second and not turns[1].calls[1].finished
    assert ToolCall.objects.get(turn=1, index=1).turn_content is None  # the answer is kept once per turn
    assert journal.ToolJournal(run.pk, 3, 1).replay() == {}


def test_a_key_is_started_once(run):
    journal.ToolJournal(run.pk, 1, 1).started(1, 0, {"name": "run_command"}, [])
    with pytest.raises(JournalError, match="journaled by another attempt"):
        journal.ToolJournal(run.pk, 1, 2).started(1, 0, {"name": "run_command"}, [])
    assert ToolCall.objects.count() == 1


def test_journal_rows_are_deleted_with_their_run(run):
    journal.ToolJournal(run.pk, 1, 1).started(0, 0, {"name": "write_file"}, None)
    run.delete()
    assert not ToolCall.objects.exists()


def test_the_journal_is_readable_in_the_admin_and_cannot_be_written_there(admin_client, run):
    key = journal.ToolJournal(run.pk, 1, 1).started(1, 0, {"name": "write_file", "input": {"path": "a.txt"}}, [])
    row = ToolCall.objects.get()
    listing = admin_client.get("/admin/loops/toolcall/")
    assert listing.status_code == 200 and key in listing.content.decode()
    assert admin_client.get(f"/admin/loops/toolcall/{row.pk}/change/").status_code == 200  # shown, read-only
    assert admin_client.get("/admin/loops/toolcall/add/").status_code == 403
    changed = admin_client.post(f"/admin/loops/toolcall/{row.pk}/change/", {"name": "run_command"})
    assert changed.status_code == 403 and ToolCall.objects.get().name == "write_file"
