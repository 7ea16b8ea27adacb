"""Every bound holds on every path (issue #25), as a state machine: random sequences through the real runner.

Three kinds of run, each driven in this thread by the real runner (`leases.claim` and `runner.drive`),
one step at a time, as a worker would pick it up:

- a Claude lead (the local Messages server plays the model) whose next act the machine chooses: it
  works on (a required check still fails), finishes (the check passes), fails (the provider refuses
  the request), delegates one or two sub-objectives, asks to delegate past its cap (the refusal is
  its tool_result), or calls a tool that needs a person's approval;
- its children, on a scripted `helper` command agent, whose acts succeed, fail, ask a person a
  question, report a little spend or more than their iteration reserved;
- a scripted `solo` command agent with a required check, acting the same ways.

Between the drives, people interject, answer questions, approve or refuse parked tool calls, and
stop runs; a worker is "killed" (it claims a run, maybe begins an iteration, and its lease expires
with it), the reaper runs, and a late driver tries to drive a run that ended.

After every step, for every run of the example:

- it began at most `max_iterations` iterations;
- no pool spent past its cap (beyond an overdraft the ledger recorded: only metered spend is
  hard-capped, a self-reported overdraft is recorded and ends the run, README "Budgets");
- each iteration it began has exactly one `iteration.finished` — but for one a lost attempt left
  (its `attempt.lost` says so) or one a killed worker still holds;
- no instruction carries an earlier one (each section at most once), and none is over its bound:
  at most 1.2 times the largest instruction this machine can build afresh; no request to the
  model is over 1.2 times its run's first request, plus that bound and the history's budget;
- a run that ended was never driven again (no claim or iteration after its `run.finished`).

Each path the machine can take is counted; the test fails unless every one was taken.
"""

import json
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from budgets.models import Pool, Reservation
from instances.models import Credential
from loops import driver, leases, lifecycle, runner, services
from loops.memory import Memory
from loops.models import Event, Iteration, Run
from tests.fakes.messages_server import Error, MessagesServer, text, tool_use, tool_uses

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "sk-ant-api03-ONEDOORMACHINE-0123456789abcdefQRSTUV"
PASS_CHECK = "sys.exit(0 if pathlib.Path('pass').exists() else 1)\n"
# The command agent of the children and the solo runs: what its next act does comes from `plan-<run>`
# in its workspace, written by the machine before it drives the run; an act after it (the run went
# on in the same drive) asks a person, so a drive ends soon, and a person has a question to answer.
AGENT = """
run = os.environ["TETHER_RUN_ID"]
plan = pathlib.Path("plan-" + run)
kind = plan.read_text() if plan.exists() else "ask"
plan.unlink(missing_ok=True)
count = pathlib.Path("n-" + run); k = int(count.read_text()) + 1 if count.exists() else 1; count.write_text(str(k))
pathlib.Path("pass").unlink(missing_ok=True)
if kind == "done":
    pathlib.Path("pass").write_text("yes")
if kind in ("spend", "overreport"):
    json.dump({"cost_usd": 0.01 if kind == "spend" else 0.09}, open(os.environ["TETHER_USAGE_FILE"], "w"))
if kind == "fail":
    print("it broke on step", k, file=sys.stderr); sys.exit(1)
if kind == "ask":
    print("TETHER_ESCALATE: left or right?", file=sys.stderr); sys.exit(3)
print("worked on step", k, "-" * 300)
"""
RESERVE_USD = "0.05"  # each command iteration reserves this; "overreport" reports $0.09

LEAD_ACTS = ("work", "finish", "fail", "delegate", "delegate_two", "delegate_refused", "approval")
AGENT_ACTS = ("ok", "done", "fail", "ask", "spend", "overreport")
MESSAGE = "Please keep the report short."
ANSWER = "Go left."

# What this machine's instructions are built from, fresh: the objective, the results of at most two
# children (each at most ~2,100 characters: outcome, detail, answer excerpt), a person's messages
# (at most MAX_PENDING of them), a failed act's summary and the failing check's backpressure.
MAX_PENDING = 3
FRESH_BOUND = 200 + 2 * 2100 + MAX_PENDING * (len(MESSAGE) + 120) + 2500
SECTIONS = (
    "The runs you delegated have finished",
    "Go on with the objective of this run",
    "A person sent these messages",
    "A previous attempt of this iteration was interrupted",
)
HISTORY_BOUND = 4 * 8000 * 2  # the compacted history's own budget, generously (tokens to bytes, JSON-escaped)

# Every path a sequence can take; the test fails unless each was taken at least once.
PATHS = (
    *(f"lead {act}" for act in LEAD_ACTS),
    *(f"solo {act}" for act in AGENT_ACTS),
    *(f"child {act}" for act in AGENT_ACTS),
    "interjection", "answer a question", "approve", "refuse an approval", "stop", "kill before a begin",
    "kill after a begin", "reap", "drive an ended run", "take over a killed lease",
    "parent resumed after its children", "wait refused on the last iteration",
)
# Counted and shown, not required (a run must be killed on every one of its attempts).
RARE = ("crashed after its last attempt",)
seen: Counter[str] = Counter()
SECONDS: Counter[str] = Counter()  # where the time goes: driving each kind of run, the invariant


def objective_of(body):
    """The run a request to the model is for, by its objective (the first message says it)."""
    first = body["messages"][0]["content"]
    for block in first if isinstance(first, list) else [{"text": first}]:
        said = str(block.get("text", "")) if isinstance(block, dict) else ""
        if "The objective of this run:\n" in said:
            return said.split("The objective of this run:\n", 1)[1].split("\n", 1)[0]
    return "?"


# derandomize seeds from the class's source, so any edit of it would draw other sequences (and the
# paths below must each be drawn): the seed is pinned to the one its source gave when the sequences
# were chosen (before claim moved to loops.leases).
SEQUENCES = 21563403593028433267820243852086908010817846542209716657771748613590417191766871038297614129642861216763897960923139


@seed(SEQUENCES)
class OneDoor(RuleBasedStateMachine):
    """Random sequences of acts, answers, stops and deaths through the real runner."""

    server: MessagesServer
    user = None
    credential = None
    make_instance = None
    script = None
    examples = 0

    def __init__(self):
        super().__init__()
        OneDoor.examples += 1
        self.n = OneDoor.examples
        self.lead_act = "work"
        self.killed: set[int] = set()  # runs a killed worker holds (its lease expired)
        self.late: set[int] = set()  # ended runs a late driver tried to drive
        self.turns: Counter[str] = Counter()
        self.requests: list[tuple[str, int]] = []  # (the run's objective, the request's size) of each model call
        self.server.responder = self.respond

    # --- set-up ---------------------------------------------------------------------------------

    @initialize()
    def instances(self):
        agent = self.script(AGENT)
        self.helper = self.make_instance(self.user, name=f"helper-{self.n}", command=agent, checks=[], max_iterations=3)
        self.solo = self.make_instance(
            self.user, name=f"solo-{self.n}", command=agent, max_iterations=4,
            checks=[{"name": "pass", "command": self.script(PASS_CHECK), "required": True}],
        )
        self.lead = self.make_instance(
            self.user, name=f"lead-{self.n}", brain="anthropic", decider="checks", base_url=self.server.url,
            credential=self.credential, model="claude-test-1", command=[],
            tools=["list_files", "read_file", "write_file", "delegate"], approval_tools=["write_file"],
            checks=[{"name": "pass", "command": self.script(PASS_CHECK), "required": True}], max_iterations=4,
        )
        self.lead.workspace_path().mkdir(parents=True, exist_ok=True)
        self.mine = [self.helper.pk, self.solo.pk, self.lead.pk]

    def runs(self):
        return Run.objects.filter(instance_id__in=self.mine).order_by("pk")

    def look(self):
        """What each rule may act on now (read after every step: the rules' preconditions use it)."""
        from loops import delegation

        runs = list(self.runs())
        live = [r for r in runs if r.status != Run.Status.FINISHED]
        drivable = [r for r in live if r.status in lifecycle.ACTIVE and (r.lease_token is None or r.pk in self.killed)]
        self.now = {
            "drivable": drivable,
            "children": [r for r in drivable if r.parent_id is not None],
            "roots": [r for r in live if r.parent_id is None],
            "killable": [r for r in drivable if r.pk not in self.killed],
            "live": [r for r in live if r.cancel_requested_at is None],
            "answerable": [
                r for r in live if r.status == Run.Status.WAITING and r.cancel_requested_at is None
                and not delegation.waiting_for_children(r)
            ],
            "ended": [r for r in runs if r.status == Run.Status.FINISHED and r.pk not in self.late],
        }

    def turn(self, data, options, kind=""):
        """One of `options`: drawn, and turned one further at each draw for `kind` in the sequence.

        Hypothesis draws the first option most (the simplest); turning spreads a sequence over all of them.
        """
        self.turns[kind] += 1
        return options[(data.draw(st.integers(0, len(options) - 1)) + self.turns[kind]) % len(options)]

    def can(kind):  # a precondition: there is a run of `kind` to act on
        return precondition(lambda self: bool(getattr(self, "now", {}).get(kind)))

    # --- the model ------------------------------------------------------------------------------

    def respond(self, body):
        """The lead's model: what the machine chose for this act; after a tool's result, it ends its turn."""
        last = body["messages"][-1]
        content = last["content"] if isinstance(last["content"], list) else []
        self.requests.append((objective_of(body), len(json.dumps(body))))
        if last["role"] == "user" and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            return text("Noted; that is all for this act.")
        # The act the machine chose; an act after it (the run went on in the same drive) asks for approval.
        act, self.lead_act = self.lead_act, "approval"
        n = self.n
        return {
            "work": text("I worked on the report."),
            "finish": text("The report is written."),
            "fail": Error(400, "the request was malformed", type="invalid_request_error"),
            "delegate": tool_use("delegate", {"to": f"helper-{n}", "objective": "draft a section", "max_cost_usd": 0.2, "max_iterations": 3}),
            "delegate_two": tool_uses([
                ("delegate", {"to": f"helper-{n}", "objective": "draft part one", "max_cost_usd": 0.2, "max_iterations": 2}),
                ("delegate", {"to": f"helper-{n}", "objective": "draft part two", "max_cost_usd": 0.2, "max_iterations": 3}),
            ]),
            "delegate_refused": tool_use("delegate", {"to": f"helper-{n}", "objective": "everything", "max_cost_usd": 50}),
            "approval": tool_use("write_file", {"path": "note.txt", "content": f"note {n}"}),
        }[act]

    # --- starting and driving runs ----------------------------------------------------------------

    @precondition(lambda self: hasattr(self, "now") and len(self.now["roots"]) < 3)
    @rule(
        kind=st.sampled_from(["lead", "lead", "solo"]), max_iterations=st.integers(1, 4),
        cap=st.sampled_from(["0.12", "0.30", "3.00"]),
    )
    def start(self, kind, max_iterations, cap):
        instance, objective = (self.lead, "write the report") if kind == "lead" else (self.solo, "tidy the notes")
        services.run_start(
            instance=instance, user=self.user, objective=f"{objective} {self.n}.{Run.objects.count()}",
            max_iterations=max_iterations, max_cost_usd="3.00" if kind == "lead" else cap,
        )

    def drive(self, run):
        """Drive `run` in this thread as a worker would, until it waits, ends, or its lease is lost."""
        took_over = run.pk in self.killed
        lease = leases.claim(run.pk, run.next_iteration, "machine-worker")
        self.killed.discard(run.pk)
        if lease is None:  # killed on every attempt: its last one was spent, and the claim ended it
            run.refresh_from_db()
            assert (run.status, run.outcome) == ("finished", "crashed"), (run.pk, run.status, run.outcome)
            seen["crashed after its last attempt"] += 1
            return run
        if took_over:
            seen["take over a killed lease"] += 1
        waiting = set(self.runs().filter(status=Run.Status.WAITING).values_list("pk", flat=True))
        runner.drive(lease, slice_seconds=3600)
        run.refresh_from_db()
        if run.outcome == "max_iterations" and any(
            undone in run.outcome_detail for undone in ("not started", "not asked", "were not run")
        ):
            seen["wait refused on the last iteration"] += 1
        for parent in self.runs().filter(pk__in=waiting, status=Run.Status.QUEUED):
            if Event.objects.filter(run=parent, kind="run.resumed", data__reason="children finished").exists():
                seen["parent resumed after its children"] += 1
        return run

    @can("drivable")
    @rule(data=st.data())
    def drive_one(self, data, runs=None):
        """A worker picks up a run and drives it: its act is what the machine draws for its kind."""
        run = self.turn(data, runs or self.now["drivable"], "run")
        if run.instance_id == self.lead.pk:
            act = self.turn(data, LEAD_ACTS, "lead")
            self.lead_act = act
            workspace = self.lead.workspace_path()
            (workspace / "pass").unlink(missing_ok=True)
            if act == "finish":
                (workspace / "pass").write_text("yes")
            (workspace / "step.txt").write_text(str(Event.objects.count()))  # the workspace changes
            kind = "lead"
        else:
            kind = "solo" if run.instance_id == self.solo.pk else "child"
            act = self.turn(data, AGENT_ACTS, kind)
            workspace = run.instance.workspace_path()
            workspace.mkdir(parents=True, exist_ok=True)
            (workspace / f"plan-{run.pk}").write_text(act)
        began = time.monotonic()
        self.drive(run)
        seen[f"{kind} {act}"] += 1
        SECONDS[kind] += time.monotonic() - began

    @can("drivable")
    @rule(data=st.data())
    def drive_again(self, data):  # driving is most of what happens: it has two rules (and a third for children)
        self.drive_one(data)

    @can("children")
    @rule(data=st.data())
    def drive_a_child(self, data):  # a child to drive only once a lead delegated: it gets a rule of its own too
        self.drive_one(data, self.now["children"])

    # --- people -----------------------------------------------------------------------------------

    @can("answerable")
    @rule(data=st.data(), approve=st.booleans())
    def answer(self, data, approve):
        """A person answers a waiting run: its question, or the tool calls it asks to run (approved or refused)."""
        run = data.draw(st.sampled_from(self.now["answerable"]))
        if Memory.of(run.history).pending_approval:
            services.run_interject(run=run, user=self.user, text="", approve=approve)
            seen["approve" if approve else "refuse an approval"] += 1
        else:
            services.run_interject(run=run, user=self.user, text=ANSWER)
            seen["answer a question"] += 1

    @can("live")
    @rule(data=st.data())
    def interject_or_stop(self, data):
        run = data.draw(st.sampled_from(self.now["live"]))
        if self.turn(data, (False, False, False, True), "stop"):  # a stop one time in four
            services.run_cancel(run=run, user=self.user)
            seen["stop"] += 1
        elif run.interjections.filter(consumed_in_iteration__isnull=True).count() < MAX_PENDING:
            services.run_interject(run=run, user=self.user, text=MESSAGE)
            seen["interjection"] += 1

    # --- dead workers, the reaper, late drivers -----------------------------------------------------

    @precondition(lambda self: hasattr(self, "now") and (self.now["killable"] or self.killed or self.now["ended"]))
    @rule(data=st.data())
    def trouble(self, data):
        """A worker dies (before or after it began an iteration), the reaper runs, or a late driver comes."""
        what = self.turn(data, ("kill", "kill after a begin", "reap", "late"), "trouble")
        if what.startswith("kill") and self.now["killable"]:
            self.kill_a_worker(data.draw(st.sampled_from(self.now["killable"])), begin=what != "kill")
        elif what == "reap" and self.killed:
            driver.reap()
            self.killed = {pk for pk in self.killed if Run.objects.filter(pk=pk, lease_holder="doomed-worker").exists()}
            seen["reap"] += 1
        elif what == "late" and self.now["ended"]:
            run = data.draw(st.sampled_from(self.now["ended"]))
            for iteration in {run.next_iteration, max(run.next_iteration - 1, 1)}:
                assert leases.claim(run.pk, iteration, "late-worker") is None
            self.late.add(run.pk)
            seen["drive an ended run"] += 1

    def kill_a_worker(self, run, begin):
        """A worker claims `run` (and maybe begins its iteration), then dies: its lease expires with it."""
        lease = leases.claim(run.pk, run.next_iteration, "doomed-worker")
        if lease is None:  # its last attempt was spent: the claim ended it crashed
            seen["crashed after its last attempt"] += 1
            return
        if begin:
            runner._begin(lease)  # it may end the run instead (a stop, the limit, the budget)
        Run.objects.filter(pk=run.pk, lease_token=lease.token).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        if Run.objects.filter(pk=run.pk, lease_token=lease.token).exists():
            self.killed.add(run.pk)
        seen["kill after a begin" if begin else "kill before a begin"] += 1

    # --- the bounds, after every step -------------------------------------------------------------

    @invariant()
    def every_bound_holds(self):
        if not hasattr(self, "mine"):
            return
        began = time.monotonic()
        self.all_bounds_hold()
        SECONDS["invariant"] += time.monotonic() - began

    def all_bounds_hold(self):
        self.look()
        runs = {run.pk: run for run in self.runs()}
        events: dict[int, list] = {pk: [] for pk in runs}
        for run_id, seq, kind, data in Event.objects.filter(run_id__in=runs).order_by("seq").values_list(
            "run_id", "seq", "kind", "data"
        ):
            events[run_id].append((seq, kind, data))
        instructions: dict[int, list] = {pk: [] for pk in runs}
        for run_id, number, instruction in Iteration.objects.filter(run_id__in=runs).values_list(
            "run_id", "number", "instruction"
        ):
            instructions[run_id].append((number, instruction))
        overdraft: Counter[int] = Counter()  # by the root of the run's tree
        for run_id, amount in Reservation.objects.filter(run_id__in=runs, overdraft__gt=0).values_list("run_id", "overdraft"):
            overdraft[runs[run_id].parent_id or run_id] += amount
        for pool in Pool.objects.filter(kind="run", run_id__in=runs):
            self.spent_within_the_cap(runs[pool.run_id], pool, overdraft[runs[pool.run_id].parent_id or pool.run_id])
        for pk, run in runs.items():
            self.iterations_within_the_limit(run, events[pk], instructions[pk])
            self.one_finish_per_begun_iteration(run, events[pk])
            self.instructions_within_their_bound(run, instructions[pk])
            self.ended_means_never_driven_again(run, events[pk])
        first: dict[str, int] = {}
        for objective, size in self.requests:
            first.setdefault(objective, size)
            assert size <= 1.2 * (first[objective] + FRESH_BOUND) + HISTORY_BOUND, (objective, first[objective], size)

    def iterations_within_the_limit(self, run, events, instructions):
        begun = {data["iteration"] for _, kind, data in events if kind == "iteration.started"}
        assert len(begun) <= run.max_iterations and max(begun, default=0) <= run.max_iterations, (run.pk, begun)
        assert len(instructions) <= run.max_iterations

    def spent_within_the_cap(self, run, pool, overdraft):
        """The run's pool spent at most its cap — beyond it only by an overdraft its tree reported (and was recorded)."""
        assert pool.limit is not None
        assert pool.spent <= pool.limit + overdraft, (run.pk, pool.name, pool.spent, pool.limit, overdraft)
        if not overdraft:
            assert pool.spent + pool.reserved <= pool.limit, (run.pk, pool.name, pool.spent, pool.reserved)
        assert run.max_cost_micros is None or run.spent_micros <= run.max_cost_micros + overdraft

    def one_finish_per_begun_iteration(self, run, events):
        started: dict[int, int] = {}
        finished: Counter[int] = Counter()
        lost: dict[int, int] = {}
        for seq, kind, data in events:
            if kind == "iteration.started":
                started[data["iteration"]] = seq
            elif kind == "iteration.finished":
                finished[data["iteration"]] += 1
            elif kind == "attempt.lost":
                lost[data["iteration"]] = seq
        assert all(count == 1 for count in finished.values()), (run.pk, finished)
        assert set(finished) <= set(started), (run.pk, finished, started)
        unfinished = sorted(set(started) - set(finished))
        if unfinished:  # only the last, lost by a killed worker (or held by one now)
            assert unfinished == [max(started)], (run.pk, unfinished)
            number = unfinished[0]
            assert run.pk in self.killed or lost.get(number, 0) > started[number], (run.pk, number, run.status)

    def instructions_within_their_bound(self, run, instructions):
        """No instruction carries an earlier one, and none is over the bound of what is built afresh."""
        bound = 1.2 * (len(run.objective) + FRESH_BOUND)
        told = dict(instructions)
        for number, instruction in instructions:
            for section in SECTIONS:
                assert instruction.count(section) <= 1, (run.pk, number, section)
            assert len(instruction) <= bound, (run.pk, number, len(instruction), bound)
            # After children, the objective and this round's results: never the instruction before (one
            # that was itself a resume may come back whole, as the base of an answer: the count above holds it).
            before = told.get(number - 1, "").split("\n\nA person sent")[0].split("\n\nA previous attempt")[0]
            if SECTIONS[0] in instruction and before and before != run.objective and SECTIONS[0] not in before:
                assert before not in instruction, (run.pk, number, before[:200])

    def ended_means_never_driven_again(self, run, events):
        ended = next((seq for seq, kind, _ in events if kind == "run.finished"), None)
        if ended is not None:
            assert run.status == Run.Status.FINISHED
            later = [kind for seq, kind, _ in events if seq > ended]
            assert not {"run.claimed", "iteration.started", "act.started", "iteration.finished"} & set(later), later


def test_every_bound_holds_on_every_path(user, make_instance, script, price, settings_fixture, capsys):
    with MessagesServer(api_key=KEY) as server:
        OneDoor.server, OneDoor.user = server, user
        OneDoor.make_instance, OneDoor.script = staticmethod(make_instance), staticmethod(script)
        OneDoor.credential = Credential.create_for(user, label="k", secret=KEY)
        began = time.monotonic()
        run_state_machine_as_test(
            OneDoor,
            settings=settings(
                max_examples=15, stateful_step_count=35, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
        took = time.monotonic() - began
    with capsys.disabled():
        print(f"\none-door machine: {OneDoor.examples} sequences in {took:.1f}s; paths taken:")
        for path in (*PATHS, *RARE):
            print(f"  {seen[path]:4d}  {path}")
        outcomes = Counter(Run.objects.filter(owner=user, status="finished").values_list("outcome", flat=True))
        print("  outcomes:", dict(sorted(outcomes.items())))
        print("  seconds:", {what: round(took, 1) for what, took in SECONDS.items()})
    assert not untaken(), f"paths never taken: {untaken()}"


def untaken():
    return [path for path in PATHS if not seen[path]]


@pytest.fixture
def settings_fixture(settings):
    settings.TETHER_COMMAND_ITERATION_RESERVE_USD = RESERVE_USD
    return settings
