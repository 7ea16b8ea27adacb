"""`python manage.py loop start|watch|cancel|interject|continue|rollback|verify-receipt` — the console-less client.

The CLI acts as the instance's (or run's) owner and calls the same service
functions as the API and the console.
"""

import sys
import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from budgets import money
from instances.models import Instance
from loops import services
from loops.models import Event, Run
from reviews import rollback
from reviews.receipts import verify_file


class Command(BaseCommand):
    help = "Start, watch, interject or cancel runs."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        start = sub.add_parser("start", help="start a run")
        start.add_argument("--instance", type=int, required=True, help="instance id")
        start.add_argument("--objective-file", required=True, help="a file holding the objective ('-' for stdin)")
        start.add_argument("--max-iterations", type=int)
        start.add_argument("--max-cost-usd")
        start.add_argument("--watch", action="store_true", help="watch the run until it finishes")
        watch = sub.add_parser("watch", help="print a run's events live until it finishes")
        watch.add_argument("run", type=int)
        watch.add_argument("--after", type=int, default=0, help="print events after this seq")
        cancel = sub.add_parser("cancel", help="stop a run")
        cancel.add_argument("run", type=int)
        interject = sub.add_parser("interject", help="send a message to a run's next iteration")
        interject.add_argument("run", type=int)
        interject.add_argument("message")
        cont = sub.add_parser("continue", help="continue a finished run as a new run (its history, its workspace)")
        cont.add_argument("run", type=int)
        cont.add_argument("--message", default="", help="folded into the new run's first instruction")
        cont.add_argument("--max-iterations", type=int, help="default: the old run's")
        cont.add_argument("--max-cost-usd", help="default: the old run's cap")
        cont.add_argument("--watch", action="store_true", help="watch the new run until it finishes")
        back = sub.add_parser(
            "rollback", help="roll a finished run's workspace back to a snapshot (without --to: list them)"
        )
        back.add_argument("run", type=int)
        back.add_argument("--to", help="start, verified, iteration-N or rollback-K")
        back.add_argument("--dry-run", action="store_true", help="say what it would change and leave; change nothing")
        verify = sub.add_parser("verify-receipt", help="check a run receipt's signature; say what was altered")
        verify.add_argument("file", help="a receipt saved from GET /v1/instances/ID/loop/RUN/receipt")

    def handle(self, action, **options):
        try:
            return getattr(self, f"do_{action.replace('-', '_')}")(**options)
        except services.Refused as exc:
            raise CommandError(exc.message) from None

    def _run(self, run_id):
        run = Run.objects.select_related("owner").filter(pk=run_id).first()
        if run is None:
            raise CommandError(f"no run {run_id}; list runs with GET /v1/instances/ID/loop")
        return run

    def do_start(self, instance, objective_file, max_iterations, max_cost_usd, watch, **_):
        found = Instance.objects.select_related("owner").filter(pk=instance).first()
        if found is None:
            raise CommandError(f"no instance {instance}")
        try:
            objective = sys.stdin.read() if objective_file == "-" else Path(objective_file).read_text()
        except OSError as exc:
            raise CommandError(f"cannot read the objective file: {exc}") from None
        run = services.run_start(
            instance=found,
            user=found.owner,
            objective=objective,
            max_iterations=max_iterations,
            max_cost_usd=max_cost_usd,
            via="cli",
        )
        self.stdout.write(f"run {run.pk} started on instance {found.pk} ({found.name})")
        if watch:
            return self.do_watch(run.pk, 0)
        return None

    def do_cancel(self, run, **_):
        found = self._run(run)
        found = services.run_cancel(run=found, user=found.owner, via="cli")
        state = found.outcome or "stop requested"
        self.stdout.write(f"run {found.pk}: {state}")

    def do_interject(self, run, message, **_):
        found = self._run(run)
        services.run_interject(run=found, user=found.owner, text=message, via="cli")
        self.stdout.write(f"run {found.pk}: message queued for the next iteration")

    def do_continue(self, run, message, max_iterations, max_cost_usd, watch, **_):
        found = self._run(run)
        new = services.run_continue(
            run=found, user=found.owner, message=message, max_iterations=max_iterations,
            max_cost_usd=max_cost_usd, via="cli",
        )
        self.stdout.write(f"run {new.pk} continues run {found.pk} ({found.outcome}) on instance {new.instance_id}")
        if watch:
            return self.do_watch(new.pk, 0)
        return None

    def do_rollback(self, run, to, dry_run, **_):
        found = self._run(run)
        if to is None:
            listed = rollback.listing(found)
            for point in listed["points"]:
                self.stdout.write(f"{point['to']:<14} {point['label']}")
            if not listed["points"]:
                self.stdout.write(f"run {found.pk} has no snapshots of its workspace to go back to")
            if listed["live_run"]:
                self.stdout.write(f"run {listed['live_run']} is live on this workspace: a rollback waits for it")
            return
        if dry_run:
            said = rollback.plan(run=found, to=to)
        else:
            said = rollback.rollback(run=found, user=found.owner, to=to, via="cli")
        self.stdout.write(_rollback_lines(found, said.as_json()))

    def do_verify_receipt(self, file, **_):
        ok, message = verify_file(file)
        if not ok:
            raise CommandError(message)
        self.stdout.write(message)

    def do_watch(self, run, after=0, **_):
        found = self._run(run)
        seq = after
        tty = self.stdout.isatty()
        while True:
            batch = list(Event.objects.filter(run=found, seq__gt=seq).order_by("seq")[:500])
            for event in batch:
                if tty:
                    self.stdout.write("\r\033[K", ending="")
                self.stdout.write(_line(event))
                seq = event.seq
            found.refresh_from_db()
            if tty:
                self.stdout.write(_progress(found), ending="")
                self.stdout.flush()
            if found.status == Run.Status.FINISHED and not batch:
                if tty:
                    self.stdout.write("")
                verified = " (verified)" if found.verified else ""
                self.stdout.write(f"run {found.pk} finished: {found.outcome}{verified} — {found.outcome_detail}")
                if found.outcome != Run.Outcome.DONE:
                    sys.exit(2)
                return None
            if found.status == Run.Status.WAITING and not batch:
                if tty:
                    self.stdout.write("")
                self.stdout.write(
                    f"run {found.pk} is waiting for a person: {found.outcome_detail}\n"
                    f"answer with: python manage.py loop interject {found.pk} 'MESSAGE'"
                )
                sys.exit(3)
            if not batch:
                time.sleep(0.3)


def _line(event: Event) -> str:
    data = event.data
    it = f"#{data['iteration']} " if "iteration" in data else ""
    summary = ""
    if event.kind == "decision.made":
        summary = f"{data.get('verdict')}: {data.get('reason', '')[:120]}"
    elif event.kind == "checks.finished":
        summary = ", ".join(f"{c['name']} {'pass' if c['passed'] else 'FAIL'}" for c in data.get("checks", []))
    elif event.kind == "act.finished":
        summary = "ok" if data.get("ok") else f"failed: {data.get('detail', '')[:120]}"
    elif event.kind == "iteration.finished":
        summary = f"${data.get('cost_usd')} in {data.get('duration_ms')} ms"
    elif event.kind == "run.finished":
        summary = f"{data.get('outcome')} — {data.get('detail', '')[:200]}"
    elif event.kind == "interjection.queued":
        summary = data.get("text", "")[:120]
    return f"[{event.seq:>4}] {event.kind:<20} {it}{summary}".rstrip()


def _rollback_lines(run: Run, said: dict) -> str:
    def named(part: dict) -> str:
        more = f" and {part['more']} more" if part["more"] else ""
        return ", ".join(part["paths"]) + more

    def count(part: dict) -> int:
        return len(part["paths"]) + part["more"]

    counts = f"{count(said['added'])} added, {count(said['modified'])} changed, {count(said['deleted'])} removed"
    if said["rolled_back"]:
        lines = [f"run {run.pk}: workspace rolled back to {said['label']} ({counts})"]
        lines.append(f"to undo it: python manage.py loop rollback {run.pk} --to {said['undo']}")
    else:
        lines = [f"run {run.pk}: rolling back to {said['label']} would make {counts}; nothing was changed"]
    if said["kept"]["paths"]:
        lines.append(f"left as they are (snapshots do not keep them): {named(said['kept'])}")
    for line in said["not_restored"]["paths"]:
        lines.append(f"not restored: {line}")
    return "\n".join(lines)


def _progress(run: Run) -> str:
    return (
        f"run {run.pk} · {run.status} · iteration {min(run.next_iteration, run.max_iterations)}/{run.max_iterations}"
        f" · {money.format_usd(run.spent_micros)}"
    )
