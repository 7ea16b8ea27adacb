"""Verify an act: run an instance's checks in its workspace; fingerprint the workspace; take the
evidence a run starts from (`starting_evidence`) and the protected paths an act changed since.

Runs in the worker, outside any transaction.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from django.conf import settings

from instances import evidence, protected, sandbox
from instances.brains import process
from instances.pinned import SKIP_DIRS as SKIP_DIRS  # re-exported: reviews.snapshot_trees skips them too
from instances.pinned import open_file_at
from loops import progress
from loops.models import Run
from loops.policy import Check
from tether.redaction import redact

OUTPUT_TAIL = 4000
MAX_FINGERPRINT_FILES = 5000
MAX_FINGERPRINT_BYTES = 32 * 1024 * 1024  # of each file (its size is in the digest too)
MAX_BASELINE_TESTS = 20_000  # test ids kept per check


def run_checks(
    specs: list[dict[str, Any]], workspace: Path, stop: threading.Event, *, instance: Any = None,
    baseline: dict[str, Any] | None = None,
) -> list[Check]:
    """Run each check in the instance's sandbox (its uid, its network grant) and return the results.

    A check passes when it exits 0 and its evidence holds (`instances.evidence.judge`, against the
    tests collected at the start of the run, `baseline`, by check name).
    """
    results = []
    for spec in specs:
        if stop.is_set():
            break
        argv = [str(part) for part in spec["command"]]
        timeout = float(spec.get("timeout", settings.TETHER_CHECK_TIMEOUT_SECONDS))
        done, found = _run(argv, workspace, stop, instance, timeout)
        judgement = evidence.judge(
            found,
            pytest_check=evidence.is_pytest(argv),
            baseline=(baseline or {}).get(str(spec["name"])),
            required=spec.get("evidence") == evidence.REPORT,
        )
        tests = evidence.tally(found)
        exited_ok = done.exit_code == 0 and not done.timed_out and not done.stopped
        output = redact((done.stdout + done.stderr)[-OUTPUT_TAIL:])
        if done.spawn_error:
            output = done.spawn_error
        elif done.timed_out:
            output += "\n[check timed out]"
        elif not judgement.ok:
            output += f"\n[not verified by its evidence: {judgement.summary}]"
        results.append(
            Check(
                name=str(spec["name"]),
                required=bool(spec.get("required", True)),
                passed=exited_ok and judgement.ok,
                output=output,
                evidence=judgement.evidence,
                evidence_detail=judgement.summary,
                progress=progress.of_check(output, exited_ok and judgement.ok, timed_out=done.timed_out or done.stopped),
                tests_ran=None if tests is None else tests[0],
                tests_failed=() if tests is None else tests[1],
            )
        )
    return results


def collect_baseline(
    specs: list[dict[str, Any]], workspace: Path, stop: threading.Event, *, instance: Any = None
) -> dict[str, Any]:
    """Return, per pytest check, the tests it collects as the run starts (`--collect-only`, nothing run).

    Taken once, before the first act: a check later passes only if every one of these ran and passed.
    """
    baseline: dict[str, Any] = {}
    for spec in specs:
        argv = [str(part) for part in spec["command"]]
        if stop.is_set() or not evidence.is_pytest(argv):
            continue
        timeout = float(spec.get("timeout", settings.TETHER_CHECK_TIMEOUT_SECONDS))
        _, found = _run([*argv, "--collect-only", "-q"], workspace, stop, instance, timeout)
        collected = [nodeid for report in found for nodeid in evidence.strings(report.get("collected"))]
        deselected = sum(evidence.deselected_count(report) or 0 for report in found)  # no count: none
        baseline[str(spec["name"])] = {"collected": collected[:MAX_BASELINE_TESTS], "deselected": deselected}
    return baseline


def starting_evidence(run: Run, stop: threading.Event) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return the evidence as the run finds it: the digests of its protected files, the tests each pytest check collects.

    The digests are those of the instance's previous run instead while a person has not accepted
    that run's change of them (`_unaccepted_baseline`).
    """
    instance = run.instance
    baseline = _unaccepted_baseline(run)
    if baseline is None:
        baseline = protected.digests(instance.workspace_path(), protected.globs_for(instance))
    collected = collect_baseline(list(instance.checks or []), instance.workspace_path(), stop, instance=instance)
    return baseline, collected


def _unaccepted_baseline(run: Run) -> dict[str, Any] | None:
    """Return the baseline of the instance's previous run if it changed protected files and was not verified.

    Tampered tests must not become the next run's starting point: until a person accepts the
    change (which verifies that run), every later run on the workspace is measured from the
    files as they were before it.
    """
    earlier = (
        Run.objects.filter(instance_id=run.instance_id, pk__lt=run.pk, protected_baseline__isnull=False)
        .order_by("-pk")
        .values("protected_baseline", "protected_changed", "verified")
        .first()
    )
    if earlier and earlier["protected_changed"] and earlier["verified"] is not True:
        return dict(earlier["protected_baseline"])
    return None


def protected_changes(run: Run, number: int) -> tuple[list[str], tuple[str, dict[str, Any]] | None]:
    """Return every protected path changed since the start (sticky), and the event of new changes."""
    globs = protected.globs_for(run.instance)
    before = list(run.protected_changed or [])
    if run.protected_baseline is None or not globs:
        return before, None
    changes = protected.compare(run.protected_baseline, protected.digests(run.instance.workspace_path(), globs), globs)
    changed = sorted({*before, *changes.paths})
    if set(changes.paths) <= set(before):
        return changed, None
    return changed, ("protected.changed", {"iteration": number, **changes.as_json(), "paths": list(changes.paths)})


def _run(
    argv: list[str], workspace: Path, stop: threading.Event, instance: Any, timeout: float
) -> tuple[process.Finished, list[dict[str, Any]]]:
    """Run one check command in the sandbox with the evidence plugin; return how it ended and its reports."""
    with tempfile.TemporaryDirectory(prefix="tether-evidence-") as reports:
        inside = sandbox.enabled()
        box = sandbox.Spec(
            workspace=workspace,
            instance_id=getattr(instance, "pk", None),
            network=bool(getattr(instance, "network", False)),
            binds=[
                sandbox.Bind(evidence.PLUGIN_DIR, evidence.PLUGIN_DIR_SEEN),
                sandbox.Bind(Path(reports), evidence.REPORT_DIR_SEEN, writable=True),
            ],
        )
        env = process.base_env(workspace)
        env.update(
            evidence.env(
                evidence.PLUGIN_DIR_SEEN if inside else str(evidence.PLUGIN_DIR),
                evidence.REPORT_DIR_SEEN if inside else reports,
            )
        )
        done = process.run(
            argv, cwd=workspace, env=env, timeout=timeout, stop=stop, cap=settings.TETHER_OUTPUT_CAP_BYTES, spec=box
        )
        return done, evidence.reports(Path(reports))


def fingerprint(workspace: Path) -> str:
    """Return a digest of the workspace's files (names and contents).

    Walked through the workspace held open (`instances.pinned`): a link counts as its target's
    name, never its content; a FIFO or device as its name only; each file's first
    MAX_FINGERPRINT_BYTES, and its size.
    """
    digest = hashlib.sha256()
    with sandbox.workspace_files(workspace) as files:
        if files is None:
            return ""
        for count, entry in enumerate(files, start=1):
            if count > MAX_FINGERPRINT_FILES:
                digest.update(b"...truncated")
                break
            digest.update(entry.path.encode(errors="surrogateescape") + b"\0" + entry.kind.encode())
            if entry.kind == "file":
                data = open_file_at(entry.dir_fd, entry.name, MAX_FINGERPRINT_BYTES)
                digest.update(b"?" if data is None else hashlib.sha256(data).digest() + str(entry.size).encode())
            elif entry.kind == "link":
                try:
                    digest.update(os.readlink(entry.name, dir_fd=entry.dir_fd).encode(errors="surrogateescape"))
                except OSError:
                    digest.update(b"?")
    return digest.hexdigest()


def as_json(checks: list[Check]) -> list[dict[str, Any]]:
    return [
        {
            "name": c.name, "required": c.required, "passed": c.passed, "output": c.output,
            "evidence": c.evidence, "evidence_detail": c.evidence_detail, "progress": c.progress,
            **({} if c.tests_ran is None else {"tests": _tests_json(c)}),
        }
        for c in checks
    ]


def _tests_json(check: Check) -> dict[str, Any]:
    """What the check's test report said: tests ran, how many failed, and the first failing ids (redacted)."""
    failed = check.tests_failed
    return {
        "ran": check.tests_ran,
        "failed": len(failed),
        "failed_names": [redact(nodeid) for nodeid in failed[: evidence.FAILED_NAMED]],
    }
