"""Receipts: the signed summary of a finished run, and their verification.

A receipt is a JSON envelope `{"receipt": DOCUMENT, "signature": SIGNATURE}`. DOCUMENT holds the
objective, the instance and its template, every iteration (its instruction's SHA-256, decision,
checks with output digests, cost and times), the attempts lost to a dead worker (what was closed
for each and what it changed), the outcome and its detail, verified or not, the
graders' verdict, the review verdict when one was given, the change card (`reviews.changecard`:
what the run changed, at a glance), the cost (with its calls, tokens and
overdrafts summed per model) and the run's times. SIGNATURE holds a SHA-256 digest of every
field (`fields`: top-level fields, and one level down — `instance.name`, `iterations[2].decision`)
and an HMAC-SHA256 over that digest map, under a key derived from `settings.SECRET_KEY` with HKDF
(its own info string, so it is unrelated to every other key derived from the secret). Verification
checks the HMAC first (so the digest map is authentic), then compares each field's digest: a
changed, added or removed field is named.

The document is redacted (`tether.redaction`) before it is signed: no key is in a receipt.

Writes `Receipt` rows (`issue`); reads runs. No network, no subprocess.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.utils import timezone

from budgets import money, spending
from loops import selectors
from reviews import changecard
from reviews.models import GradeRecord, Receipt, ReviewItem
from tether import keys
from tether.redaction import redact_data

VERSION = 1
ALGORITHM = "HMAC-SHA256"
_SALT = b"tether.receipts"
_INFO = b"tether receipt signing v1"
# Fields expanded one level down in the digest map, so verification can name what changed there.
_DEPTH = 2


def signing_key() -> bytes:
    return keys.derive(_SALT, _INFO)


def _verification_keys() -> list[bytes]:
    return [keys.derive(_SALT, _INFO, secret) for secret in keys.secrets()]


def key_id(key: bytes) -> str:
    """Return a public name for a key (a digest of it), to tell "another key" from "altered"."""
    return hashlib.sha256(b"tether receipt key id\x00" + key).hexdigest()[:16]


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical(value)).hexdigest()


def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def field_digests(document: Any) -> dict[str, str]:
    """Return {field path: digest} for every field of a receipt document, one level down."""
    found: dict[str, str] = {}

    def walk(value: Any, path: str, depth: int) -> None:
        if depth < _DEPTH and isinstance(value, dict) and value:
            for name, inner in value.items():
                walk(inner, f"{path}.{name}" if path else str(name), depth + 1)
        elif 0 < depth < _DEPTH and isinstance(value, list) and value:
            for index, inner in enumerate(value):  # a list's items stand at the list's own level
                walk(inner, f"{path}[{index}]", depth)
        else:
            found[path or "(receipt)"] = _digest(value)

    walk(document, "", 0)
    return found


def sign(document: dict[str, Any]) -> dict[str, Any]:
    """Return the signed envelope of a receipt document."""
    key = signing_key()
    fields = field_digests(document)
    mac = hmac.new(key, canonical(fields), hashlib.sha256).hexdigest()
    return {
        "receipt": document,
        "signature": {"alg": ALGORITHM, "key_id": key_id(key), "fields": fields, "mac": mac},
    }


@dataclass(frozen=True)
class Verification:
    ok: bool
    message: str
    altered: tuple[str, ...] = ()


def _names(paths: list[str], limit: int = 20) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def verify(envelope: Any) -> Verification:
    """Check a receipt envelope's signature; when it fails, say what was altered."""
    if not isinstance(envelope, dict) or "receipt" not in envelope or "signature" not in envelope:
        return Verification(False, "not a Tether receipt: expected an object with 'receipt' and 'signature'")
    signature, document = envelope["signature"], envelope["receipt"]
    if not isinstance(signature, dict) or not isinstance(signature.get("fields"), dict):
        return Verification(False, "the signature block is malformed (no digest map); the receipt was altered", ("signature",))
    if signature.get("alg") != ALGORITHM:
        return Verification(False, f"unknown signature algorithm {signature.get('alg')!r}", ("signature.alg",))
    signed_fields = signature["fields"]
    mac = str(signature.get("mac", ""))
    keys = _verification_keys()
    authentic = any(
        hmac.compare_digest(hmac.new(key, canonical(signed_fields), hashlib.sha256).hexdigest(), mac) for key in keys
    )
    if not authentic:
        if signature.get("key_id") not in {key_id(k) for k in keys}:
            return Verification(
                False,
                "the receipt was not signed by this server's key (another server, or its secret key changed), "
                "or its signature block was altered",
                ("signature",),
            )
        return Verification(False, "the signature block (its digest map or MAC) was altered", ("signature",))
    actual = field_digests(document)
    changed = sorted(p for p in actual.keys() & signed_fields.keys() if actual[p] != signed_fields[p])
    added = sorted(actual.keys() - signed_fields.keys())
    removed = sorted(signed_fields.keys() - actual.keys())
    if not (changed or added or removed):
        run = document.get("run") if isinstance(document, dict) else None
        issued = document.get("issued_at") if isinstance(document, dict) else None
        return Verification(True, f"the receipt of run {run} is authentic (issued {issued}); nothing was altered")
    parts = []
    if changed:
        parts.append(f"changed: {_names(changed)}")
    if added:
        parts.append(f"added: {_names(added)}")
    if removed:
        parts.append(f"removed: {_names(removed)}")
    return Verification(False, "the receipt was altered — " + "; ".join(parts), tuple(changed + added + removed))


def resign_stored() -> tuple[int, int]:
    """Re-sign under the current key every stored receipt that verifies under an earlier one.

    For a secret key rotation, before the old key is dropped. Return (re-signed, not
    authentic): a receipt that does not verify keeps its signature, so it still shows it was altered.
    """
    current = key_id(signing_key())
    resigned = refused = 0
    for receipt in Receipt.objects.order_by("pk").iterator():
        envelope = receipt.envelope
        signature = envelope.get("signature") if isinstance(envelope, dict) else None
        if isinstance(signature, dict) and signature.get("key_id") == current:
            continue
        if not verify(envelope).ok:
            refused += 1
            continue
        Receipt.objects.filter(pk=receipt.pk).update(envelope=sign(envelope["receipt"]))
        resigned += 1
    return resigned, refused


def verify_file(path: str | Path) -> tuple[bool, str]:
    """Verify the receipt stored in a file; return (ok, a sentence saying what was found)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        return False, f"cannot read {path}: {exc.strerror or exc}"
    try:
        envelope = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return False, f"{path} is not JSON: {exc}"
    result = verify(envelope)
    return result.ok, result.message


# --- building ----------------------------------------------------------------------------------


def _at(value: Any) -> str | None:
    return value.isoformat() if value else None


def _usd(micros: int) -> str:
    return money.usd_string(micros)


def document(run: Any) -> dict[str, Any]:
    """Return the receipt document of a run, from the database."""
    instance = run.instance
    shown = selectors.run_json(run, RUN_FIELDS)
    grade = GradeRecord.latest_for(run)
    return {
        "version": VERSION,
        "run": run.pk,
        "objective": shown["objective"],
        "instance": {"id": instance.pk, "name": instance.name, "brain": instance.brain, "decider": instance.decider},
        "template": instance.template.name if instance.template_id else None,
        "owner": run.owner.get_username(),
        "iterations": [_iteration(it) for it in run.iterations.order_by("number")],
        "lost_attempts": _lost_attempts(run),
        "outcome": shown["outcome"],
        "outcome_detail": shown["outcome_detail"] or "",  # a receipt says "" when there is none
        "verified": shown["verified"],
        "grade": None if grade is None else {key: grade.as_json()[key] for key in GRADE_FIELDS},
        "review": _review(run),
        "change_card": changecard.for_run(run),
        "cost": {
            "spent_usd": shown["spent_usd"],
            "spent_micros": shown["spent_micros"],
            "by_model": spending.spending_by_model(run.pk),
        },
        "parent": shown["parent"],
        # A delegation tree's receipts verify together: each child's receipt, by its signed digest map.
        "children": [
            {"run": child.pk, "receipt_sha256": _digest(envelope["signature"]["fields"]) if envelope else None}
            for child, envelope in _children_receipts(run)
        ],
        "created_at": shown["created_at"],
        "started_at": shown["started_at"],
        "finished_at": shown["finished_at"],
        "issued_at": timezone.now().isoformat(),
    }


# What a receipt holds of the run's and the grade's JSON (`loops.selectors.run_json`, `GradeRecord.as_json`).
RUN_FIELDS = (
    "objective", "outcome", "outcome_detail", "verified", "spent_usd", "spent_micros", "parent",
    "created_at", "started_at", "finished_at",
)
GRADE_FIELDS = ("iteration", "verified", "outcome", "reasons", "response_check", "judge", "unchanged_workspace")


def _iteration(it: Any) -> dict[str, Any]:
    """One iteration as the receipt holds it: digests of what was said, never the text."""
    decision = it.decision or {}
    return {
        "number": it.number,
        "instruction_sha256": _text_digest(it.instruction),
        "response_sha256": _text_digest(it.response),
        "act_ok": it.act_ok,
        "decision": {"verdict": decision.get("verdict"), "reason": decision.get("reason", "")},
        "checks": [
            {
                "name": c.get("name"),
                "required": c.get("required"),
                "passed": c.get("passed"),
                # What the pass rests on: "report" (a test report from outside the
                # workspace) or "exit code" (its exit status only).
                "evidence": c.get("evidence", "exit code"),
                "output_sha256": _text_digest(str(c.get("output", ""))),
            }
            for c in (it.checks or [])
        ],
        "workspace_fingerprint": it.fingerprint,
        "cost_usd": _usd(it.cost_micros),
        "started_at": _at(it.started_at),
        "finished_at": _at(it.finished_at),
    }


def _lost_attempts(run: Any) -> list[dict[str, Any]]:
    return [
        {
            "iteration": d.get("iteration"),
            "attempt": d.get("attempt"),
            "worker": d.get("worker"),
            "lost_at": d.get("lost_at"),
            "closed_usd": d.get("closed_usd"),
            "changed": d.get("changed") or [],
            "more": d.get("more") or 0,
            "changes_unknown": d.get("changes_unknown"),
            "tool_calls": d.get("tool_calls") or [],
        }
        for d in run.events.filter(kind="attempt.lost").order_by("seq").values_list("data", flat=True)
    ]


def _review(run: Any) -> dict[str, Any] | None:
    """The person's verdict on the run, when one was given (the latest)."""
    verdict = (
        ReviewItem.objects.filter(run=run, status__in=[ReviewItem.Status.ACCEPTED, ReviewItem.Status.REJECTED])
        .select_related("decided_by")
        .order_by("-decided_at", "-id")
        .first()
    )
    if verdict is None:
        return None
    return {
        "verdict": verdict.status,
        "reason": verdict.reason,
        "note": verdict.note,
        "by": verdict.decided_by.get_username() if verdict.decided_by else None,
        "at": _at(verdict.decided_at),
    }


def _children_receipts(run: Any) -> list[tuple[Any, dict[str, Any] | None]]:
    children = list(run.children.order_by("pk")) if hasattr(run, "children") else []
    return [(child, for_run(child)) for child in children]


def issue(run: Any) -> Receipt:
    """Sign the run's receipt and store it (replacing an earlier one, e.g. before a review verdict)."""
    envelope = sign(redact_data(document(run)))
    receipt, _ = Receipt.objects.update_or_create(
        run_id=run.pk, defaults={"envelope": envelope, "signed_at": timezone.now()}
    )
    return receipt


def for_run(run: Any) -> dict[str, Any] | None:
    """Return a finished run's receipt envelope, issuing it if none was yet; None while the run is live."""
    receipt = Receipt.objects.filter(run_id=run.pk).first()
    if receipt is not None:
        return receipt.envelope
    if run.status != "finished":
        return None
    return issue(run).envelope
