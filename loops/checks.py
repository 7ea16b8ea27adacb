"""Verify an act: run an instance's checks in its workspace; fingerprint the workspace.

Runs in the worker, outside any transaction.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

from django.conf import settings

from instances import sandbox
from instances.brains import process
from instances.redaction import redact
from loops.policy import Check

OUTPUT_TAIL = 4000
SKIP_DIRS = {".git", "__pycache__", ".ruff_cache", ".pytest_cache", ".mypy_cache", "node_modules", ".venv"}
MAX_FINGERPRINT_FILES = 5000


def run_checks(
    specs: list[dict[str, Any]], workspace: Path, stop: threading.Event, *, instance: Any = None
) -> list[Check]:
    """Run each check in the instance's sandbox (its uid, its network grant) and return the results."""
    box = sandbox.Spec(
        workspace=workspace,
        instance_id=getattr(instance, "pk", None),
        network=bool(getattr(instance, "network", False)),
    )
    results = []
    for spec in specs:
        if stop.is_set():
            break
        done = process.run(
            list(spec["command"]),
            cwd=workspace,
            env=process.base_env(workspace),
            timeout=float(spec.get("timeout", settings.TETHER_CHECK_TIMEOUT_SECONDS)),
            stop=stop,
            cap=settings.TETHER_OUTPUT_CAP_BYTES,
            spec=box,
        )
        output = redact((done.stdout + done.stderr)[-OUTPUT_TAIL:])
        if done.spawn_error:
            output = done.spawn_error
        elif done.timed_out:
            output += "\n[check timed out]"
        results.append(
            Check(
                name=str(spec["name"]),
                required=bool(spec.get("required", True)),
                passed=done.exit_code == 0 and not done.timed_out and not done.stopped,
                output=output,
            )
        )
    return results


def fingerprint(workspace: Path) -> str:
    """Return a digest of the workspace's files (names and contents)."""
    digest = hashlib.sha256()
    if not workspace.is_dir():
        return ""
    count = 0
    for root, dirs, files in os.walk(workspace):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            path = Path(root) / name
            count += 1
            if count > MAX_FINGERPRINT_FILES:
                digest.update(b"...truncated")
                return digest.hexdigest()
            digest.update(str(path.relative_to(workspace)).encode() + b"\0")
            try:
                with open(path, "rb") as fh:
                    digest.update(hashlib.file_digest(fh, "sha256").digest())
            except OSError:
                digest.update(b"?")
    return digest.hexdigest()


def as_json(checks: list[Check]) -> list[dict[str, Any]]:
    return [{"name": c.name, "required": c.required, "passed": c.passed, "output": c.output} for c in checks]
