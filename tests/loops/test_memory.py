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


def resumed(memory, number, *, answer="I helped with it", delegated="to 'helper': 'help with the report'", refused=()):
    """An iteration told a round's results (its call id and child run numbered as they really are)."""
    told = (
        "The runs you delegated have finished. Their results (one per delegate call):\n\n"
        f"## delegate call toolu_01Ab{number}Xy → run {100 + number} on helper: done, spent $0.00\n"
        f"final answer (excerpt):\n{answer}\n\nGo on with the objective of this run:\nwrite the report"
    )
    return memory.after(
        instruction=told, fingerprint=f"f{number}", signature="s", act_ok=True, response="", checks={},
        verdict="continue", number=number, delegation=f"0123abcd {delegated}" if delegated else "", refused=refused,
    )


def test_iterations_alike_are_one_entry_saying_how_many_and_since_when():
    memory = Memory()
    for number in range(1, 101):
        memory = Memory.of(resumed(memory, number).as_json())
    [entry] = memory.snapshot
    assert (entry["iteration"], entry["first"], entry["times"]) == (100, 1, 100)
    assert entry["delegated"] == "to 'helper': 'help with the report'"
    assert "toolu_01Ab100Xy → run 200" in entry["instruction"]  # the last one's text, as it was
    # What the policy compares is not folded: it keeps its window.
    assert len(memory.instructions) == policy.KEPT and len(memory.delegations) == policy.KEPT


def test_iterations_that_differ_keep_their_own_entries():
    memory = Memory()
    for number in range(1, 6):  # another answer each round: what the children said differs
        memory = resumed(memory, number, answer=f"{number} of 5 tests pass")
    for number in range(6, 9):  # the same answer, but each delegates another objective
        memory = resumed(memory, number, delegated=f"to 'helper': 'step {number}'")
    memory = resumed(memory, 9, delegated="")  # delegates nothing
    memory = after(memory, 10)  # told something else
    assert [e["iteration"] for e in memory.snapshot] == list(range(1, 11))
    assert not any("times" in e for e in memory.snapshot)
    assert after(Memory(), 1).snapshot == (
        {"iteration": 1, "instruction": "step 1", "response": "did 1", "checks": {"tests": True}, "verdict": "continue"},
    )  # an iteration that delegated nothing and had nothing refused says neither


def test_a_repeat_after_other_iterations_joins_its_entry_and_moves_last():
    memory = Memory()
    for number in range(1, 41):  # A, B, A, B, ...: two entries, however long it goes
        if number % 2:
            memory = resumed(memory, number)
        else:
            memory = resumed(memory, number, answer="the helper failed", delegated="")
    assert [(e["iteration"], e["first"], e["times"]) for e in memory.snapshot] == [(39, 1, 20), (40, 2, 20)]


def test_a_refusal_known_after_the_record_joins_the_entry_it_makes_alike():
    memory = resumed(Memory(), 1, refused=["delegate refused: this tree of runs already has 20, the limit"])
    memory = resumed(memory, 2).refused_after(["delegate refused: this tree of runs already has 20, the limit"])
    [entry] = memory.snapshot
    assert (entry["iteration"], entry["first"], entry["times"]) == (2, 1, 2)
    assert entry["refused"] == ["delegate refused: this tree of runs already has 20, the limit"]
    assert memory.refusals[-1] == ("delegate refused: this tree of runs already has 20, the limit",)
