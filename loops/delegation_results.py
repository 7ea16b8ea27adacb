"""What a parent run is told of its children: their results, and the patch of each `copy` child's workspace.

`render_results` writes the section of the parent's next instruction that names each child's
outcome, verified flag, detail, answer excerpt (`EXCERPT`), spend and, for `copy`, the patch of its
workspace against the parent's (`workspace_patch`, bounded by `PATCH_CHARS`, read through both
workspaces held open). `resume_instruction` puts it before the objective; `results_key` digests a
round's results, blind to run numbers, so the same round twice is recognised. See `loops.delegation`.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from contextlib import ExitStack
from typing import Any

from budgets import money
from instances import pinned, sandbox
from loops.decision import scrub
from loops.models import Run

EXCERPT = 1500
PATCH_CHARS = 20_000
PATCH_SKIP = frozenset({".git", "__pycache__"})


def workspace_patch(parent: Run, child: Run) -> str:
    """Return the unified diff of a `copy` child's workspace against its parent's (bounded).

    Both are read through their directories held open: a link shows as its target's name,
    never its content, and only regular files are read.
    """
    out: list[str] = []
    with ExitStack() as held:
        sides: list[pinned.Pinned | None] = []
        for run in (parent, child):
            try:
                sides.append(held.enter_context(pinned.Pinned(sandbox.checked_workspace(run.instance.workspace_path()))))
            except (sandbox.WorkspaceRefused, OSError):
                sides.append(None)
        listed = [_entries(side) for side in sides]
        for name in sorted(set(listed[0]) | set(listed[1])):
            a, b = (_lines(side, name, entries.get(name)) for side, entries in zip(sides, listed, strict=True))
            if a != b:
                out.extend(difflib.unified_diff(a, b, f"a/{name}", f"b/{name}"))
            if sum(len(line) for line in out) > PATCH_CHARS:
                out.append("\n… (patch cut)\n")
                break
    return "".join(out)[:PATCH_CHARS]


def _entries(side: pinned.Pinned | None) -> dict[str, str]:
    """{path: kind} of the files and links in a workspace (not .git or caches)."""
    if side is None:
        return {}
    return {e.path: e.kind for e in side.walk(skip=PATCH_SKIP) if e.kind in ("file", "link")}


def _lines(side: pinned.Pinned | None, name: str, kind: str | None) -> list[str]:
    if side is None or kind is None:
        return []
    try:
        if kind == "link":
            parent, _, leaf = name.rpartition("/")
            where = side.dir(parent or ".")
            try:
                return [f"(a symbolic link to {os.readlink(leaf, dir_fd=where)})\n"]
            finally:
                os.close(where)
        data, _ = side.read(name, PATCH_CHARS)
    except OSError:
        return []
    return data.decode(errors="replace").splitlines(keepends=True)


def render_results(parent: Run, children: list[Run], refused: list[dict[str, Any]]) -> str:
    """Return what the parent's next instruction says of its children (the delegate calls' results)."""
    lines = ["The runs you delegated have finished. Their results (one per delegate call):"]
    for child in children:
        asked = (parent.delegation.get("placed") or {}).get(str(child.pk)) or child.delegation
        verified = " (verified)" if child.verified else (" (unverified)" if child.outcome == "done" else "")
        answer = (child.iterations.order_by("-number").values_list("response", flat=True).first() or "")[-EXCERPT:]
        lines.append(
            f"\n## delegate call {asked.get('call', '')} → run {child.pk} on {child.instance.name}: "
            f"{child.outcome}{verified}, spent {money.format_usd(child.spent_micros)}\n"
            f"detail: {child.outcome_detail[:500]}\nfinal answer (excerpt):\n{answer}"
        )
        if asked.get("workspace") == "copy":
            lines.append(f"patch of its copy of your workspace:\n{workspace_patch(parent, child) or '(no changes)'}")
    for entry in refused:
        lines.append(f"\n## delegate call {entry['id']} to {entry['to']!r} was refused: {entry['error']}")
    return "\n".join(lines)


def resume_instruction(results: str, objective: str) -> str:
    """Return a parent's instruction after its children: this round's results, then the objective."""
    return f"{results}\n\nGo on with the objective of this run:\n{objective}"


def results_key(parent: Run, children: list[Run], refused: list[dict[str, Any]]) -> str:
    """A digest of what a round of children came back with, blind to run numbers and run-to-run noise."""
    calls = {c.get("id"): c.get("input") or {} for c in parent.delegation.get("calls", [])}
    rows = []
    for child in children:
        asked = (parent.delegation.get("placed") or {}).get(str(child.pk)) or {}
        answer = child.iterations.order_by("-number").values_list("response", flat=True).first() or ""
        rows.append([
            str(calls.get(asked.get("call"), {}).get("to", "")), child.outcome, child.verified,
            scrub(child.outcome_detail[:500]), scrub(answer[-EXCERPT:]),
        ])
    rows.sort(key=str)
    rows += sorted([str(r.get("to", "")), str(r.get("error", ""))] for r in refused)
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False, default=str).encode()).hexdigest()[:16]
