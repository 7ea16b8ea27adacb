"""Chaos harness: runs survive killed workers, restarted web processes and cut database connections.

Not a test, but it fails like one: exit status 1 when an invariant breaks. With PostgreSQL
and Redis on loopback, in a throwaway database (tether_chaos_<pid>), it starts two worker
clusters (`manage.py qcluster`, each in its own session so SIGKILL takes the whole group) and
two web processes (`manage.py serve --web-only`), starts runs of scripted agents (the
`command` brain: a shell script that waits, reports spend and succeeds after a few steps),
attaches one websocket viewer per run (it reconnects to the other web process with its last
seq whenever its socket drops), and then, at random moments (seeded):

- SIGKILLs a worker cluster mid-work and starts a replacement;
- restarts a web process (SIGTERM, start again on the same port);
- cuts a worker cluster's database connections for a few seconds
  (pg_terminate_backend on its application_name, again and again).

Runs vary: most finish `done`, some hit `max_iterations`, some run their instance's pool
dry (`budget_exhausted`, a few of them after an overdraft), a few are stopped by a person
(`cancelled`). At the end it checks and prints:

- every run finished with an outcome from the taxonomy;
- iteration numbers are 1..n, each recorded once, and n matches the run's position;
- the books: for every pool spent == Σ settled (and == Σ of its ledger entries), reserved ==
  Σ held == 0, no reservation left held, no pool over its limit unless an overdraft was recorded;
- event seqs are gap-free, and every viewer saw every event exactly once, across reconnects;
- nothing stayed active without a live lease or a pickup deadline the reaper would act on
  (sampled every half second throughout).

It also reports the longest wait for pickup (from a run's last event to its next claim), overall
and after a cut; with `--cuts`, also the attempts and spend lost to cuts. Goals: 0, $0, ≤ 1 s.

Bounded: a fixed deadline for the whole run; everything started is stopped; loopback only.

Run: python -m bench.chaos [--runs 50] [--seconds 60] [--seed N]
     python -m bench.chaos --short      (CI: 8 runs, one kill, one web restart, one cut; < 3 min)
     python -m bench.chaos --cuts [--short]  (cut connections only: attempts and spend lost to cuts)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import _harness as h
from budgets import money

USERNAME = "chaos"
# Short enough for recovery within the run, long enough for a loaded 2-core machine.
LEASE_SECONDS = 4
REAPER_SECONDS = 1
# Each iteration of a `command` instance reserves $0.05 (TETHER_COMMAND_ITERATION_RESERVE_USD).


def agent(act: float, cost: str) -> list[str]:
    """The scripted agent: wait, change the workspace, report spend; succeed at step GOAL."""
    return [
        "sh",
        "-c",
        f"sleep {act}; echo $TETHER_ITERATION > step-$TETHER_RUN_ID; "
        f'echo \'{{"cost_usd": {cost}}}\' > "$TETHER_USAGE_FILE"; '
        'echo "step $TETHER_ITERATION"; '
        '[ "$TETHER_ITERATION" -ge "$GOAL" ] || { echo "step $TETHER_ITERATION of $GOAL" >&2; exit 1; }',
    ]


# Instance shapes: (name, act seconds, cost per act in USD, share of the fault window a run
# should last, iteration bound as a share of its goal, pool limit in USD). Runs outlast the
# window a little, so every fault lands on live work.
SHAPES = [
    ("steady", 2.0, "0.01", 1.1, None, None),
    ("slow", 3.0, "0.01", 1.2, None, None),
    ("quick", 1.2, "0.005", 0.9, None, None),
    ("bounded", 1.8, "0.01", 1.0, 0.5, None),  # max_iterations halfway
    ("pricey", 1.5, "0.04", 1.2, None, "0.40"),  # runs its pool dry: budget_exhausted
    ("overdraws", 1.5, "0.20", 1.2, None, "0.50"),  # costs more than it reserves: overdraft, then refused
]


def goal(act: float, share: float, seconds: float) -> int:
    return max(3, round(seconds * share / act))


# --- roles (subprocesses with the chaos environment) ----------------------------------------------------


def prepare(runs: int, seconds: float, home: str) -> dict[str, Any]:
    """Migrate; make the user (with a limited pool), a session, and the instances with their pools."""
    h.django_setup()

    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    from budgets import limits
    from budgets import services as budgets
    from instances.models import Instance

    call_command("migrate", verbosity=0, interactive=False)
    user = get_user_model().objects.create_user(USERNAME, password="chaos-pw-123")
    limits.set_limit(budgets.user_pool(user), 100_000_000, "chaos")  # $100: limited, never reached
    instances = []
    for name, act, cost, share, bound, limit in SHAPES:
        steps = goal(act, share, seconds)
        instance = Instance.objects.create(
            owner=user,
            name=name,
            command=agent(act, cost),
            env={"GOAL": str(steps)},
            workspace=str(Path(home) / "workspaces" / "ws" / name),
            max_iterations=max(2, round(steps * bound)) if bound else steps + 5,
            act_timeout_seconds=60,
        )
        if limit is not None:
            limits.set_limit(budgets.instance_pool(instance), money.usd_to_micros(limit, exact=True), "chaos")
        instances.append(instance.pk)
    client = Client()
    client.force_login(user)
    plan = [instances[i % len(instances)] for i in range(runs)]
    return {"cookie": f"sessionid={client.cookies['sessionid'].value}", "plan": plan}


def start(plan_file: str) -> dict[str, Any]:
    """Start a run per planned instance; return their ids."""
    h.django_setup()
    from instances.models import Instance
    from loops import services

    plan = json.loads(Path(plan_file).read_text())
    instances = Instance.objects.select_related("owner").in_bulk(set(plan))
    runs = [
        services.run_start(
            instance=instances[i], user=instances[i].owner, objective=f"chaos {n}", via="api"
        ).pk
        for n, i in enumerate(plan)
    ]
    return {"runs": runs}


def cancel(run_id: str) -> dict[str, Any]:
    """Stop a run as its owner would (the console's and the API's service)."""
    h.django_setup()
    from loops import services
    from loops.models import Run

    run = Run.objects.select_related("owner").get(pk=int(run_id))
    try:
        run = services.run_cancel(run=run, user=run.owner, via="api")
    except services.Refused as refused:
        return {"run": run.pk, "refused": refused.message}
    return {"run": run.pk, "status": run.status}


AFTERMATH = timedelta(seconds=10)


def pickup_waits(
    events: Iterable[tuple[int, str, datetime]], cuts: Sequence[tuple[datetime, datetime]]
) -> dict[str, float]:
    """Return the longest wait for pickup, overall and after a cut (seconds).

    `events` are (run, kind, time) in each run's order. A run waits for pickup from its event
    before a `run.claimed` (queued, handed back at a slice's end, or reaped) to that claim; a
    wait is after a cut when it began while connections were being cut or within
    `AFTERMATH` of the end (a queue that lost its connection stalls after the cut itself).
    """
    longest = after_cut = 0.0
    previous: dict[int, datetime] = {}
    for run_id, kind, at in events:
        before = previous.get(run_id)
        previous[run_id] = at
        if kind != "run.claimed" or before is None:
            continue
        wait = (at - before).total_seconds()
        longest = max(longest, wait)
        if any(before <= ends + AFTERMATH and at >= starts for starts, ends in cuts):
            after_cut = max(after_cut, wait)
    return {"longest": longest, "after_cut": after_cut}


def audit(runs_file: str, seen_file: str, cuts_file: str | None = None) -> dict[str, Any]:
    """Check the invariants against the database and the viewers' logs; return the findings."""
    h.django_setup()
    from django.db.models import Count, Sum
    from django.db.models.functions import Coalesce

    from budgets.models import LedgerEntry, Pool, Reservation
    from loops.models import Event, Iteration, Run

    ids = json.loads(Path(runs_file).read_text())
    seen = json.loads(Path(seen_file).read_text()) if Path(seen_file).exists() else []
    failures: list[str] = []
    runs = {run.pk: run for run in Run.objects.filter(pk__in=ids)}
    outcomes: dict[str, int] = {}

    # 1. every run finished, with an outcome from the taxonomy
    for run in runs.values():
        outcomes[run.outcome or f"({run.status})"] = outcomes.get(run.outcome or f"({run.status})", 0) + 1
        if run.status != Run.Status.FINISHED:
            failures.append(f"run {run.pk} did not finish: {run.status}")
        elif run.outcome not in Run.Outcome.values:
            failures.append(f"run {run.pk} finished with {run.outcome!r}, not an outcome of the taxonomy")
        if run.lease_token is not None:
            failures.append(f"run {run.pk} is {run.status} and still holds a lease")
    if len(runs) != len(ids):
        failures.append(f"{len(ids) - len(runs)} run(s) are missing")

    # 2. iterations: 1..n once each, n = the run's position
    numbers: dict[int, list[int]] = {}
    for run_id, number in Iteration.objects.filter(run_id__in=ids).values_list("run_id", "number"):
        numbers.setdefault(run_id, []).append(number)
    twice = Iteration.objects.filter(run_id__in=ids).values("run_id", "number").annotate(n=Count("id"))
    for row in twice.filter(n__gt=1):
        failures.append(f"run {row['run_id']}: iteration {row['number']} recorded {row['n']} times")
    for run in runs.values():
        got = sorted(numbers.get(run.pk, []))
        if got != list(range(1, run.iterations_done + 1)):
            failures.append(f"run {run.pk}: iterations {got} but the run is at {run.iterations_done}")
        # The run's money trail: its recorded iterations are its settled reservations, and what it
        # spent adds what dead attempts left reserved (settled as abandoned, at the full amount).
        cost = Iteration.objects.filter(run=run).aggregate(s=Sum("cost_micros"))["s"] or 0
        closed = dict(
            Reservation.objects.filter(run_id=run.pk)
            .exclude(status=Reservation.Status.HELD)
            .values_list("status")
            .annotate(s=Sum("actual"))
            .order_by()
        )
        settled = closed.get(Reservation.Status.SETTLED) or 0
        if cost != settled:
            failures.append(
                f"run {run.pk}: its iterations cost {cost} but its settled reservations {settled}"
            )
        if run.spent_micros != settled + (closed.get(Reservation.Status.ABANDONED) or 0):
            failures.append(
                f"run {run.pk}: spent {run.spent_micros} but settled {settled} + abandoned "
                f"{closed.get(Reservation.Status.ABANDONED) or 0}"
            )
        # Every dead attempt is on its run's timeline: its `attempt.lost` says what was closed for it.
        lost = Event.objects.filter(run=run, kind="attempt.lost").values_list("data", flat=True)
        told = sum(money.usd_to_micros(str(d.get("closed_usd") or "0"), exact=True) for d in lost)
        if told != (closed.get(Reservation.Status.ABANDONED) or 0):
            failures.append(
                f"run {run.pk}: its attempt.lost events closed {told} but its abandoned reservations "
                f"{closed.get(Reservation.Status.ABANDONED) or 0}"
            )

    # 3. the books
    held = list(Reservation.objects.filter(status=Reservation.Status.HELD).values_list("pk", "run_id"))
    for pk, run_id in held:
        failures.append(f"reservation {pk} of run {run_id} is still held")
    closed = list(
        Reservation.objects.filter(
            status__in=[Reservation.Status.SETTLED, Reservation.Status.ABANDONED]
        ).values_list("chain", "actual")
    )
    overdrawn = set(
        LedgerEntry.objects.filter(kind=LedgerEntry.Kind.OVERDRAFT).values_list("pool_id", flat=True)
    )
    pools = []
    for pool in Pool.objects.all():
        settled = sum(actual or 0 for chain, actual in closed if pool.pk in chain)
        sums = LedgerEntry.objects.filter(pool=pool).aggregate(s=Sum("spent_delta"), r=Sum("reserved_delta"))
        pools.append({"pool": pool.name, "limit": pool.limit, "spent": pool.spent, "reserved": pool.reserved})
        if pool.spent != settled:
            failures.append(f"pool {pool.name!r}: spent {pool.spent} but Σ settled is {settled}")
        if pool.spent != (sums["s"] or 0) or pool.reserved != (sums["r"] or 0):
            failures.append(
                f"pool {pool.name!r}: balances {pool.spent}/{pool.reserved} but its ledger sums to "
                f"{sums['s'] or 0}/{sums['r'] or 0}"
            )
        if pool.reserved != 0:
            failures.append(f"pool {pool.name!r}: {pool.reserved} still reserved at the end")
        if pool.limit is not None and pool.spent + pool.reserved > pool.limit and pool.pk not in overdrawn:
            failures.append(
                f"pool {pool.name!r}: {pool.spent} spent over its limit {pool.limit}, no overdraft"
            )

    # ... and at every moment a reservation was granted, each limited pool of its chain kept
    # spent + reserved <= limit (the entry carries the balances right after the grant)
    grants = LedgerEntry.objects.filter(kind=LedgerEntry.Kind.RESERVE, limit_after__isnull=False)
    for entry in grants.values(
        "pool__name", "reservation_id", "spent_after", "reserved_after", "limit_after"
    ):
        if entry["spent_after"] + entry["reserved_after"] > entry["limit_after"]:
            failures.append(
                f"pool {entry['pool__name']!r}: reservation {entry['reservation_id']} granted past the limit "
                f"({entry['spent_after']} + {entry['reserved_after']} > {entry['limit_after']})"
            )

    # 4. events gap-free; every viewer saw each exactly once
    last = dict(Run.objects.filter(pk__in=ids).values_list("pk", "last_seq"))
    for run_id, seqs in _seqs(Event, ids).items():
        if seqs != list(range(1, len(seqs) + 1)) or len(seqs) != last[run_id]:
            failures.append(f"run {run_id}: event seqs are not 1..{last[run_id]}")
    viewers = {"count": len(seen), "reconnects": 0, "events": 0}
    for log in seen:
        viewers["reconnects"] += max(0, log["connects"] - 1)
        viewers["events"] += len(log["seqs"])
        run_id = log["run_id"]
        if log["duplicates"]:
            failures.append(f"viewer of run {run_id} got seqs {log['duplicates'][:5]} twice")
        if log["gaps"]:
            failures.append(f"viewer of run {run_id} skipped from seq to seq {log['gaps'][:5]}")
        if log["seqs"] != list(range(1, last.get(run_id, 0) + 1)):
            failures.append(
                f"viewer of run {run_id} saw {len(log['seqs'])} of {last.get(run_id, 0)} events "
                f"(last {log['seqs'][-1:] or 'none'})"
            )
    if len(seen) != len(ids):
        failures.append(f"{len(ids) - len(seen)} viewer(s) reported nothing")

    return {
        "outcomes": outcomes,
        "iterations": sum(len(v) for v in numbers.values()),
        "reaped": Event.objects.filter(run_id__in=ids, kind="run.reaped").count(),
        "claims": Event.objects.filter(run_id__in=ids, kind="run.claimed").count(),
        "abandoned": Reservation.objects.filter(status=Reservation.Status.ABANDONED).count(),
        "abandoned_micros": Reservation.objects.filter(status=Reservation.Status.ABANDONED).aggregate(
            n=Coalesce(Sum("actual"), 0)
        )["n"],
        "crashed": Run.objects.filter(pk__in=ids, outcome=Run.Outcome.CRASHED).count(),
        "overdrafts": LedgerEntry.objects.filter(kind=LedgerEntry.Kind.OVERDRAFT).count(),
        "overdrawn_reservations": Reservation.objects.filter(overdraft__gt=0).count(),
        "pools": pools,
        "viewers": viewers,
        "pickup": pickup_waits(
            Event.objects.filter(run_id__in=ids).order_by("run_id", "seq").values_list("run_id", "kind", "created_at"),
            [
                (datetime.fromisoformat(a), datetime.fromisoformat(b))
                for a, b in (json.loads(Path(cuts_file).read_text()) if cuts_file else [])
            ],
        ),
        "failures": failures,
    }


def _seqs(event_model: Any, ids: list[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {run_id: [] for run_id in ids}
    for run_id, seq in (
        event_model.objects.filter(run_id__in=ids).order_by("run_id", "seq").values_list("run_id", "seq")
    ):
        out[run_id].append(seq)
    return out


# --- the orchestration --------------------------------------------------------------------------------


class Watch:
    """The harness's own view of the database (psycopg, autocommit): progress and live invariants."""

    def __init__(self, db: str) -> None:
        import psycopg

        self.admin = psycopg.connect(f"{h.PG_URL}/postgres?application_name=chaos-harness", autocommit=True)
        self.db = psycopg.connect(f"{h.PG_URL}/{db}?application_name=chaos-harness", autocommit=True)
        self.stale: dict[int, str] = {}

    def finished(self, ids: list[int]) -> int:
        row = self.db.execute(
            "SELECT count(*) FROM loops_run WHERE status = 'finished' AND id = ANY(%s)", [ids]
        ).fetchone()
        return int(row[0]) if row else 0

    def check_leases(self, slack: timedelta) -> None:
        """Note active runs whose lease (or pickup deadline) passed longer ago than the reaper allows."""
        rows = self.db.execute(
            "SELECT id, status, lease_holder, lease_expires_at FROM loops_run "
            "WHERE status IN ('queued', 'running') AND (lease_expires_at IS NULL OR lease_expires_at < now() - %s)",
            [slack],
        ).fetchall()
        for run_id, status, holder, expires in rows:
            self.stale.setdefault(
                run_id, f"run {run_id} {status}, holder {holder!r}, lease expired {expires}"
            )

    def cut(self, application_name: str) -> int:
        rows = self.admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            [application_name],
        ).fetchall()
        return sum(1 for (ok,) in rows if ok)

    def close(self) -> None:
        self.admin.close()
        self.db.close()


class Fleet:
    """The Tether processes under test: worker clusters and web processes, and what was done to them."""

    def __init__(self, home: Path, db: str, redis: str) -> None:
        self.home, self.db, self.redis = home, db, redis
        self.logs = home / "logs"
        self.logs.mkdir(exist_ok=True)
        self.clusters: list[tuple[str, h.Proc]] = []
        self.webs: list[tuple[int, h.Proc]] = []
        self.retired: list[h.Proc] = []
        self.serial = 0
        self.actions: list[str] = []
        self.cuts: list[tuple[str, str]] = []  # when connections were being cut (UTC, ISO 8601)
        self.began = time.monotonic()

    def env(self, app: str, **more: str) -> dict[str, str]:
        return h.base_env(
            self.home,
            DATABASE_URL=h.database_url(self.db, app),
            REDIS_URL=self.redis,
            TETHER_LEASE_SECONDS=str(LEASE_SECONDS),
            TETHER_REAPER_SECONDS=str(REAPER_SECONDS),
            TETHER_STOP_POLL_SECONDS="0.25",
            **more,
        )

    def note(self, what: str) -> None:
        line = f"[{time.monotonic() - self.began:6.1f}s] {what}"
        self.actions.append(line)
        print(line, flush=True)

    def start_cluster(self) -> str:
        self.serial += 1
        name = f"chaos-w{self.serial}"
        proc = h.qcluster(name, self.env(name, TETHER_WORKERS="1"), self.logs)
        self.clusters.append((name, proc))
        return name

    def start_web(self, port: int) -> None:
        self.serial += 1
        name = f"chaos-web{self.serial}"
        self.webs.append((port, h.serve_web(name, port, self.env(name), self.logs)))

    def kill_cluster(self, rng: random.Random) -> None:
        name, proc = self.clusters.pop(rng.randrange(len(self.clusters)))
        proc.kill()
        self.retired.append(proc)
        replacement = self.start_cluster()
        self.note(f"SIGKILLed worker cluster {name} (whole process group); started {replacement}")

    def restart_web(self, rng: random.Random) -> None:
        port, proc = self.webs.pop(rng.randrange(len(self.webs)))
        proc.stop()
        self.retired.append(proc)
        self.start_web(port)
        self.note(f"restarted the web process on :{port} (SIGTERM, then `serve --web-only` again)")

    def cut_database(self, rng: random.Random, watch: Watch, seconds: float) -> None:
        name, _ = self.clusters[rng.randrange(len(self.clusters))]
        ends, cut, began = time.monotonic() + seconds, 0, datetime.now(UTC).isoformat()
        while time.monotonic() < ends:
            cut += watch.cut(name)
            time.sleep(0.2)
        self.cuts.append((began, datetime.now(UTC).isoformat()))
        self.note(f"cut {name}'s database connections for {seconds:.0f}s ({cut} backends terminated)")

    def alive(self) -> list[int]:
        return [p.pid for _, p in self.clusters] + [p.pid for _, p in self.webs]

    def stop(self) -> None:
        for proc in [p for _, p in self.clusters] + [p for _, p in self.webs] + self.retired:
            proc.stop()


def chaos(args: argparse.Namespace) -> int:
    if not h.pg_available():
        print("chaos: PostgreSQL does not answer on 127.0.0.1:5432", file=sys.stderr)
        return 2
    redis = h.redis_url()
    if redis is None:
        print("chaos: Redis does not answer (REDIS_URL or 127.0.0.1:6379)", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    db = f"tether_chaos_{os.getpid()}"
    home = Path(tempfile.mkdtemp(prefix="tether-chaos-"))
    h.fresh_database(db)
    fleet = Fleet(home, db, redis)
    watch: Watch | None = None
    viewer: h.Proc | None = None
    broken = True
    hard_deadline = time.monotonic() + args.budget
    print(
        f"chaos: {args.runs} runs, faults for {args.seconds:.0f}s, seed {args.seed}; "
        f"lease {LEASE_SECONDS}s, reaper every {REAPER_SECONDS}s; logs in {home}",
        flush=True,
    )
    try:
        made = h.role(
            "bench.chaos", fleet.env("chaos-prepare"), "prepare", str(args.runs), str(args.seconds), str(home)
        )
        (home / "plan.json").write_text(json.dumps(made["plan"]))
        ports = [h.free_port(), h.free_port()]
        fleet.start_cluster()
        fleet.start_cluster()
        # One web process after the other: two first starts at once race to create the first
        # account and the loser exits (`serve` does not tolerate the IntegrityError).
        for port in ports:
            fleet.start_web(port)
            h.wait_http_ok(port, "/healthz", 90)
        h.wait_until(
            lambda: json.loads(h.http_get(f"http://127.0.0.1:{ports[0]}/readyz")[1]).get("ready"),
            60,
            "/readyz to report the worker clusters",
        )
        watch = Watch(db)
        run_ids: list[int] = h.role(
            "bench.chaos", fleet.env("chaos-start"), "start", str(home / "plan.json")
        )["runs"]
        (home / "runs.json").write_text(json.dumps(run_ids))
        fleet.note(f"started {len(run_ids)} runs on two worker clusters, two web processes")
        spec = {
            "runs": run_ids,
            "ports": ports,
            "cookie": made["cookie"],
            "seconds": max(10.0, hard_deadline - time.monotonic() - 20),
            "spread": 1.0,
        }
        (home / "viewers.json").write_text(json.dumps(spec))
        viewer = h.Proc(
            "viewers",
            [sys.executable, "-m", "bench.chaos", "--role", "viewers", str(home / "viewers.json"),
             str(home / "seen.json")],
            fleet.env("chaos-viewers"),
            fleet.logs,
        )  # fmt: skip

        # The faults: a shuffled plan spread over the chaos window, one at a time.
        faults = ["kill", "web", "cut"] * (1 if args.short else 3)
        if not args.short:
            faults += [rng.choice(["kill", "web", "cut"]) for _ in range(2)]
        if args.cuts:  # nothing but cut connections: every attempt lost is lost to a cut
            faults = ["cut"] * (3 if args.short else 8)
        rng.shuffle(faults)
        cancels = rng.sample(run_ids, k=min(len(run_ids), 1 if args.short else 3))
        step = args.seconds / (len(faults) + 1)
        moments = sorted(rng.uniform(step * (i + 0.5), step * (i + 1.5)) for i in range(len(faults)))
        cancel_at = sorted(rng.uniform(1, args.seconds * 0.6) for _ in cancels)
        slack = timedelta(seconds=LEASE_SECONDS + 4 * REAPER_SECONDS + 6)
        t0 = time.monotonic()
        while faults or cancels:
            now = time.monotonic() - t0
            if cancels and now >= cancel_at[0]:
                cancel_at.pop(0)
                run_id = cancels.pop(0)
                answer = h.role("bench.chaos", fleet.env("chaos-cancel"), "cancel", str(run_id))
                fleet.note(f"a person stopped run {run_id}: {answer.get('status') or answer.get('refused')}")
            if faults and now >= moments[0]:
                moments.pop(0)
                fault = faults.pop(0)
                if fault == "kill":
                    fleet.kill_cluster(rng)
                elif fault == "web":
                    fleet.restart_web(rng)
                else:
                    fleet.cut_database(rng, watch, rng.uniform(2, 4))
            watch.check_leases(slack)
            if time.monotonic() > hard_deadline:
                break
            time.sleep(0.2)

        # Let everything finish (bounded), still watching the leases.
        while time.monotonic() < hard_deadline - 15:
            watch.check_leases(slack)
            if watch.finished(run_ids) == len(run_ids):
                break
            time.sleep(0.5)
        finished = watch.finished(run_ids)
        fleet.note(f"{finished}/{len(run_ids)} runs finished")
        try:
            viewer.proc.wait(timeout=max(5.0, min(30.0, hard_deadline - time.monotonic())))
        except Exception:
            viewer.signal_group(15)
            viewer.proc.wait(timeout=15)
        fleet.stop()
        (home / "cuts.json").write_text(json.dumps(fleet.cuts))
        findings = h.role(
            "bench.chaos", fleet.env("chaos-audit"), "audit",
            str(home / "runs.json"), str(home / "seen.json"), str(home / "cuts.json"),
        )  # fmt: skip
        findings["failures"] += list(watch.stale.values())
        if finished < len(run_ids):
            findings["failures"].insert(
                0, f"{len(run_ids) - finished} run(s) still active when the {args.budget:.0f}s budget ran out"
            )
        report(args, fleet, findings, time.monotonic() - fleet.began)
        broken = bool(findings["failures"])
        return 1 if broken else 0
    finally:
        if viewer is not None:
            viewer.stop()
        fleet.stop()
        if watch is not None:
            watch.close()
        if not args.keep:
            h.drop_database(db)
            if not broken:
                shutil.rmtree(home, ignore_errors=True)  # the logs stay when something broke


def report(args: argparse.Namespace, fleet: Fleet, findings: dict[str, Any], elapsed: float) -> None:
    v = findings["viewers"]
    print(f"\nChaos ({'short' if args.short else 'full'}, seed {args.seed}), {elapsed:.0f}s")
    print(f"  faults                 {len(fleet.actions) - 2} actions (above)")
    print(f"  outcomes               {findings['outcomes']}")
    print(
        f"  iterations             {findings['iterations']}; {findings['claims']} claims, "
        f"{findings['reaped']} runs re-scheduled by the reaper, {findings['abandoned']} reservations "
        f"settled as abandoned, {findings['overdrawn_reservations']} settled above their reservation, "
        f"{findings['overdrafts']} pool overdrafts recorded"
    )
    if args.cuts:
        print(
            f"  lost to cuts           {findings['reaped']} attempts re-scheduled by the reaper (goal 0), "
            f"{money.format_usd(findings['abandoned_micros'])} settled as abandoned (goal $0), "
            f"{findings['crashed']} runs crashed"
        )
    pickup = findings["pickup"]
    print(
        f"  pickup                 longest wait {pickup['longest']:.1f}s; while a cut was on "
        f"{pickup['after_cut']:.1f}s" + (" (goal ≤ 1 s)" if args.cuts else "")
    )
    print(f"  viewers                {v['count']}, {v['events']} events seen, {v['reconnects']} reconnects")
    limited = [p for p in findings["pools"] if p["limit"] is not None]
    print(
        "  limited pools          "
        + ", ".join(f"{p['pool']}: {money.format_usd(p['spent'])}/{money.format_usd(p['limit'])}" for p in limited)
    )
    checks = [
        "every run finished with an outcome from the taxonomy",
        "iteration numbers 1..n, none recorded twice",
        "books: spent == Σ settled == Σ ledger, reserved == Σ held == 0, no grant past a limit,"
        " a pool over its limit only by a recorded overdraft",
        "event seqs gap-free; each viewer saw every event exactly once across reconnects",
        "nothing active without a live lease or pickup deadline (sampled throughout)",
    ]
    if findings["failures"]:
        print(f"\nINVARIANTS BROKEN ({len(findings['failures'])}):")
        for failure in findings["failures"][:50]:
            print(f"  - {failure}")
        print(f"(logs kept in {fleet.home})")
    else:
        print("\nall invariants hold:")
        for check in checks:
            print(f"  ok  {check}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="CI: a few runs, one kill, one restart, one cut")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=None, help="length of the fault window")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the throwaway database and the logs")
    parser.add_argument("--cuts", action="store_true", help="cut connections only: attempts and spend lost to cuts")
    args = parser.parse_args()
    args.runs = args.runs or (8 if args.short else 50)
    args.seconds = args.seconds or (20.0 if args.short else 60.0)
    args.seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10_000)
    args.budget = 160.0 if args.short else 300.0  # the whole harness, setup to audit
    sys.exit(chaos(args))


ROLES = {
    "prepare": lambda a: prepare(int(a[0]), float(a[1]), a[2]),
    "start": lambda a: start(a[0]),
    "cancel": lambda a: cancel(a[0]),
    "audit": lambda a: audit(*a[:3]),
    "viewers": lambda a: h.run_viewers(a[0], a[1]),
}

if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--role":
        print(json.dumps(ROLES[sys.argv[2]](sys.argv[3:])))
    else:
        main()
