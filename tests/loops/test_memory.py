"""A run's rolling memory (`loops.memory.Memory`): one typed value, read tolerantly, written whole."""

from loops import policy
from loops.memory import SNAPSHOT_KEPT, Memory


def after(memory, number, *, ok=True, pending=()):
    return memory.after(
        instruction=f"step {number}", fingerprint=f"f{number}", signature=f"s{number}", act_ok=ok,
        response=f"did {number}", checks={"tests": ok}, verdict="continue", number=number, pending=pending,
    )


def test_an_empty_or_malformed_store_reads_as_an_empty_memory_and_writes_nothing():
    assert Memory.of(None) == Memory.of({}) == Memory()
    junk = {"instructions": "not a list", "progress": [["only one"], 5], "failed_acts": True,
            "snapshot": ["text", {"iteration": 1}], "approved_calls": None}
    read = Memory.of(junk)
    assert read.instructions == () and read.progress == () and read.failed_acts == 0
    assert read.snapshot == ({"iteration": 1},)
    assert Memory().as_json() == {}


def test_what_an_iteration_leaves_round_trips_through_the_store_and_keeps_only_the_policys_window():
    memory = Memory()
    for number in range(1, 30):
        memory = Memory.of(after(memory, number, ok=number % 2 == 0).as_json())
    assert memory.instructions == tuple(f"step {n}" for n in range(30 - policy.KEPT, 30))
    assert memory.progress == tuple((f"f{n}", f"s{n}") for n in range(30 - policy.KEPT, 30))
    assert len(memory.snapshot) == SNAPSHOT_KEPT and memory.snapshot[-1]["iteration"] == 29
    assert memory.failed_acts == 1  # the 29th failed, the 28th did not
    assert after(memory, 30, ok=False).failed_acts == 2
    assert memory.recent_instructions("next")[-1] == "next" and len(memory.recent_instructions("next")) == policy.KEPT


def test_approved_calls_are_handed_to_one_act_only_and_a_refusal_approves_nothing():
    asked = after(Memory(), 1, pending=[{"name": "run_command", "input": {"cmd": "rm -r build"}, "id": "t1"}])
    assert [c["name"] for c in asked.pending_approval] == ["run_command"]
    approved = Memory.of(asked.answered(True).as_json())
    assert approved.pending_approval == () and approved.approved_calls == (
        {"name": "run_command", "input": {"cmd": "rm -r build"}},
    )
    assert after(approved, 2).approved_calls == ()  # spent by the act it was handed to
    refused = asked.answered(False)
    assert refused.pending_approval == () and refused.approved_calls == ()
