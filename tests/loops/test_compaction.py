"""The loop compacts a run's history before it hands it to a brain or to the `llm` decider.

`loops.compaction` owns the rule (recent iterations nearly whole, older ones a line, the oldest
counted, within TETHER_CONTEXT_BUDGET_TOKENS); a brain is given the text (`ActRequest.history`)
beside the snapshot it was made from, and compacts nothing itself.
"""

from pathlib import Path

import pytest

from loops import compaction, leases
from loops.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

SEEN: list[tuple[int, list[dict], str]] = []  # (iteration, the snapshot, the history text), act by act


class RecordingBrain:
    def __init__(self, instance):
        self.instance = instance

    def act(self, request):
        from instances.brains.base import Reply, Usage

        SEEN.append((request.iteration, [dict(s) for s in request.snapshot], request.history))
        request.workspace.mkdir(parents=True, exist_ok=True)
        (request.workspace / "n").write_text(str(request.iteration))  # progress: the loop goes on
        return Reply(ok=True, text=f"answer {request.iteration}", usage=Usage(cost_micros=10))


def test_the_loop_hands_a_brain_its_history_compacted_within_the_budget(user, settings):
    from instances.models import Instance
    from loops import runner, services
    from loops.memory import Memory

    settings.TETHER_BRAINS = {"recording": f"{__name__}.RecordingBrain"}
    settings.TETHER_CONTEXT_RECENT = 1
    SEEN.clear()
    instance = Instance.objects.create(
        owner=user, name="recorded", brain="recording", decider="checks",
        workspace=str(Path(settings.TETHER_WORKSPACES) / "r"), max_iterations=5, act_timeout_seconds=30,
    )
    run = services.run_start(instance=instance, user=user, objective="record")
    earlier = tuple(
        {"iteration": n, "instruction": f"step {n}", "response": f"answer {n}", "verdict": "continue"} for n in (1, 2, 3)
    )
    Run.objects.filter(pk=run.pk).update(history=Memory(snapshot=earlier).as_json())  # as a continued run carries it
    runner.drive(leases.claim(run.pk, 1, "test"), slice_seconds=3600)
    [(_, snapshot, history)] = SEEN
    assert snapshot == list(earlier) and history == compaction.for_prompt(earlier)
    # TETHER_CONTEXT_RECENT = 1: the latest iteration nearly whole, the two before it a line each.
    assert "Iteration 3:" in history and "answer 3" in history
    assert "Iteration 2:" not in history and "- #2 continue; did: step 2" in history and "- #1" in history


def test_for_prompt_reads_the_budget_from_settings(settings):
    items = [{"iteration": n, "instruction": f"step {n} " + "x" * 3000, "response": "ok"} for n in range(1, 40)]
    settings.TETHER_CONTEXT_BUDGET_TOKENS, settings.TETHER_CONTEXT_RECENT = 2000, 3
    wide = compaction.for_prompt(items)
    assert wide == compaction.compact_history(items, budget_tokens=2000, recent=3)
    settings.TETHER_CONTEXT_BUDGET_TOKENS, settings.TETHER_CONTEXT_RECENT = 400, 1
    narrow = compaction.for_prompt(items)
    assert narrow == compaction.compact_history(items, budget_tokens=400, recent=1)
    assert len(narrow) <= 400 * 4 < len(wide)
