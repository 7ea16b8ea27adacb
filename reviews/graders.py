"""Grade a `done` before the run is allowed to finish with it.

Runs in the worker, outside any transaction (the judge makes a model call and the diff runs
git). Writes one `GradeRecord` per graded iteration (idempotent). `on_done_proposed` is the
grader `reviews.apps` registers with `loops.grading` (after the composition's role check) and
returns `grade(run, final_iteration, checks)`; the loop feeds the
grade's `assessment` to `loops.policy.verdict`, the one place "done / verified" is decided (it
also applies the command checks and the protected evidence). What the graders look at:

1. **Command checks** are the policy's: `verified` needs the instance's required checks to have
   run after the final act and passed. A grade's own `verified` says only whether the graders
   vouch for the done.
2. **Response check** (`Grading.response_schema` / `response_pattern`): the final answer must
   parse as JSON and satisfy the schema, and must match the pattern. A violation is turned back
   into the loop with the problem as the next instruction; on the last allowed iteration the run
   ends `failed`.
3. **Claimed done, changed nothing**: when the instance expects changes (it has checks, is made
   from a coding template, or its `Grading.expects_changes` says so) and the workspace fingerprint
   equals the one taken at the run's start (`reviews.snapshots.take`), the done is not verified.
4. **LLM rubric judge** (`Grading.judge`): `fail` is turned back into the loop like a failed
   response check; `needs-human` keeps the done but unverified and routes it to review.

What grades a done is set where the agent is configured: the instance's own fields
(`judge_rubric`, `judge_model`, `judge_pass_threshold`, `response_schema`; from its template's
JSON, the console, the API or MCP) come first. The admin's `reviews.models.Grading` rows, keyed by
instance then by the instance's agent template, fill what those leave empty (and hold the
pattern, the sampling and `expects_changes`); then the defaults (no response check, no judge).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import jsonschema
import referencing
import referencing.exceptions
from django.conf import settings

from instances.brains.base import Usage
from instances.validation import json_schema_problem
from loops import policy, tamper
from loops.grading import FinalAct
from reviews import judge as judge_mod
from reviews import snapshots
from reviews.judge import Verdict
from reviews.models import GradeRecord, Grading
from tether.redaction import redact

__all__ = ["FinalAct", "Grade", "grade", "on_done_proposed"]

PATTERN_TIMEOUT_CHARS = 200_000  # the answer a pattern is searched in is capped (regexes can be slow)
DEFAULT_SAMPLE_PERCENT = Decimal(10)

UNCHANGED = "claimed done, changed nothing: the workspace is exactly as it was when the run started"


@dataclass(frozen=True)
class Config:
    """The grading configuration in force for one instance."""

    response_schema: dict[str, Any] | None = None
    response_pattern: str = ""
    judge: bool = False
    judge_criteria: str = ""
    judge_model: str = ""
    judge_pass_threshold: int = 0
    sample_percent: Decimal = DEFAULT_SAMPLE_PERCENT
    expects_changes: bool = False


def config_for(instance: Any) -> Config:
    """Return the grading configuration of `instance`: its own fields, its admin row, its template's, then defaults."""
    fields = SimpleNamespace(
        response_schema=instance.response_schema or None,
        response_pattern="",
        judge=True if instance.judge_rubric else None,
        judge_criteria=instance.judge_rubric,
        judge_model=instance.judge_model,
        sample_percent=None,
        expects_changes=None,
    )
    rows: list[Any] = [fields]
    own = Grading.objects.filter(instance=instance).first()
    if own is not None:
        rows.append(own)
    if instance.template_id is not None:
        shared = Grading.objects.filter(template_id=instance.template_id).first()
        if shared is not None:
            rows.append(shared)

    def pick(name: str, empty: Any = None) -> Any:
        for row in rows:
            value = getattr(row, name)
            if value is not None and value != "":
                return value
        return empty

    coding = bool(instance.checks) or (
        instance.template is not None
        and instance.template.name in settings.TETHER_CODING_TEMPLATES
    )
    default_percent = Decimal(str(settings.TETHER_REVIEW_SAMPLE_PERCENT))
    expects = pick("expects_changes")
    return Config(
        response_schema=pick("response_schema"),
        response_pattern=pick("response_pattern", ""),
        judge=bool(pick("judge", False)),
        judge_criteria=pick("judge_criteria", ""),
        judge_model=pick("judge_model", ""),
        judge_pass_threshold=instance.judge_pass_threshold or 0,
        sample_percent=Decimal(pick("sample_percent", default_percent)),
        expects_changes=coding if expects is None else bool(expects),
    )


# --- the response check (pure) --------------------------------------------------------------------


@dataclass(frozen=True)
class ResponseCheck:
    passed: bool
    detail: str
    # The grading itself is broken (an invalid schema or pattern): no answer can pass, so the agent
    # is not sent back; the done stays unverified and goes to a person.
    misconfigured: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "detail": self.detail, "misconfigured": self.misconfigured}


_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)\n?```", re.DOTALL | re.IGNORECASE)


def parse_answer(text: str) -> Any:
    """Return the JSON value an answer holds: the whole answer, a fenced block, or the first value in it.

    Raises ValueError when there is none.
    """
    stripped = text.strip()
    try:
        return json.loads(stripped)
    except ValueError:
        pass
    for fence in _FENCE.finditer(text):
        try:
            return json.loads(fence.group(1))
        except ValueError:
            continue
    decoder = json.JSONDecoder()
    for match in re.finditer(r"[\[{]", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        return value
    raise ValueError("the final answer holds no JSON value")


def _misconfigured(schema: Any, pattern: str) -> str:
    if pattern:
        try:
            re.compile(pattern)
        except re.error as exc:
            return f"the pattern is not a regular expression ({exc})"
    if schema is not None and (why := json_schema_problem(schema)):
        return f"the schema {why}"
    return ""


def _never_retrieve(uri: str) -> referencing.Resource[Any]:
    raise referencing.exceptions.NoSuchResource(ref=uri)


NO_REMOTE: referencing.Registry[Any] = referencing.Registry(retrieve=_never_retrieve)


def _validator(schema: dict[str, Any]) -> Any:
    """Return a validator for `schema` that resolves only the schema's own parts: it never fetches a `$ref`."""
    return jsonschema.validators.validator_for(schema)(schema, registry=NO_REMOTE)


def check_response(text: str, *, schema: dict[str, Any] | None, pattern: str) -> ResponseCheck | None:
    """Return whether a final answer satisfies the response schema and pattern; None if neither is set."""
    if schema is None and not pattern:
        return None
    if broken := _misconfigured(schema, pattern):
        return ResponseCheck(False, f"the response check is misconfigured: {broken}; fix the grading", True)
    problems = []
    if schema is not None:
        try:
            value = parse_answer(text)
        except ValueError as exc:
            problems.append(f"the answer must be JSON satisfying the response schema, but {exc}")
        else:
            try:
                errors = sorted(_validator(schema).iter_errors(value), key=lambda e: list(e.absolute_path))
            except referencing.exceptions.Unresolvable:
                return ResponseCheck(
                    False,
                    "the response check is misconfigured: the schema refers to a schema Tether does not fetch "
                    "(only '$ref's starting with '#' resolve); fix the grading",
                    True,
                )
            for error in errors[:5]:
                where = "/".join(str(p) for p in error.absolute_path) or "(the whole answer)"
                problems.append(f"schema: at {where}: {error.message[:300]}")
            if len(errors) > 5:
                problems.append(f"schema: and {len(errors) - 5} more problems")
    if pattern and re.search(pattern, text[:PATTERN_TIMEOUT_CHARS], re.MULTILINE) is None:
        problems.append(f"the answer does not match the required pattern {pattern!r}")
    if problems:
        return ResponseCheck(False, "; ".join(problems))
    return ResponseCheck(True, "the answer satisfies the response " + ("schema" if schema is not None else "pattern"))


# --- the grade ---------------------------------------------------------------------------------------


@dataclass
class Grade:
    """What the graders make of a done.

    `outcome` is "done" (finish done; `verified`: the graders vouch for it), "retry" (the answer was
    rejected: go on with `instruction`) or "failed" (rejected on the last allowed iteration).
    `review` asks for a person whatever the outcome. `usage` is what the judge spent: add it to the
    iteration's cost.
    """

    verified: bool
    outcome: str
    review: bool
    reasons: list[str]
    instruction: str = ""
    response_check: ResponseCheck | None = None
    judge: Verdict | None = None
    unchanged_workspace: bool | None = None
    usage: Usage = field(default_factory=Usage)

    @property
    def assessment(self) -> policy.Assessment:
        """Return what `loops.policy.verdict` needs of this grade (a judge's pass is evidence, like a check's)."""
        evidence = ""
        if self.verified and self.judge is not None and self.judge.verdict == "pass":
            scored = f", scored {self.judge.score}" if self.judge.score is not None else ""
            evidence = f"an independent judge passed it against its rubric{scored}"
        return policy.Assessment(self.outcome, self.verified, tuple(self.reasons), self.instruction, evidence)

    def as_json(self) -> dict[str, Any]:
        """Return the grade as JSON: the one mapping, for its event and its `GradeRecord` (`GradeRecord.as_json`)."""
        return {
            "verified": self.verified,
            "outcome": self.outcome,
            "review": self.review,
            "reasons": self.reasons,
            "response_check": self.response_check.as_json() if self.response_check else None,
            "judge": self.judge.as_json() if self.judge else None,
            "unchanged_workspace": self.unchanged_workspace,
        }

    def as_event(self, iteration: int) -> tuple[str, dict[str, Any]]:
        """Return the `grade.finished` event the runner may append to the run's timeline."""
        return "grade.finished", {"iteration": iteration, **self.as_json()}


def _rejected(run: Any, final: Any, reasons: list[str], heading: str, body: str, **found: Any) -> Grade:
    last = final.number >= run.max_iterations
    claim = "the agent claimed done but " + "; ".join(reasons)
    if last:
        reasons = [f"{claim} (on the last allowed iteration, {final.number} of {run.max_iterations})"]
        return Grade(False, "failed", True, reasons, **found)
    instruction = f"The objective is not done: {heading}\n\n{body}\n\nFix this, then finish the objective."
    return Grade(False, "retry", False, [claim], instruction=instruction, **found)


def grade(
    run: Any,
    final_iteration: Any,
    checks: Sequence[policy.Check],
    *,
    stop: threading.Event | None = None,
    meter: Any = None,
) -> Grade:
    """Grade the done proposed by `final_iteration` of `run` (see the module docstring); record it.

    `final_iteration` is anything with `number`, `response` and `fingerprint` (a `FinalAct`, or a
    recorded `loops.models.Iteration`). `checks` are the results the runner got after the act.
    `stop` (the lease's) abandons the judge's model call when the run is being stopped.
    """
    config = config_for(run.instance)
    answer = final_iteration.response or ""
    reasons: list[str] = []
    found: dict[str, Any] = {}

    response = check_response(answer, schema=config.response_schema, pattern=config.response_pattern)
    found["response_check"] = response
    if response is not None and response.misconfigured:
        reasons.append(response.detail)
    elif response is not None and not response.passed:
        problem = f"the final answer fails the response check: {response.detail}"
        heading = "the final answer does not have the required form."
        return _record(run, final_iteration, _rejected(run, final_iteration, [problem], heading, response.detail, **found))

    tampering = tamper_reason(run)
    if tampering:
        reasons.append(tampering)
    unchanged = _unchanged(run, config, final_iteration)
    found["unchanged_workspace"] = unchanged
    if unchanged:
        reasons.append(UNCHANGED)

    verdict = None
    if config.judge:
        verdict = _judge(run, config, answer, checks, stop=stop, meter=meter)
        found["judge"] = verdict
        found["usage"] = verdict.usage
        said = "; ".join(verdict.reasons) or verdict.error or "no reasons given"
        if verdict.verdict == "fail":
            body = "The reviewer's reasons:\n" + "\n".join(f"- {r}" for r in (verdict.reasons or [said]))
            heading = "an independent review of the result rejected it."
            rejected = _rejected(run, final_iteration, [f"the judge rejected the result: {said}"], heading, body, **found)
            return _record(run, final_iteration, rejected)
        if verdict.verdict == "needs-human":
            reasons.append(f"the judge asks for a person: {said}")

    broken = response is not None and response.misconfigured
    judged_ok = verdict is None or verdict.verdict == "pass"
    verified = not unchanged and not broken and judged_ok and not tampering
    review = bool(unchanged) or broken or bool(tampering) or (verdict is not None and verdict.verdict == "needs-human")
    return _record(run, final_iteration, Grade(verified, "done", review, reasons, **found))


def _unchanged(run: Any, config: Config, final: Any) -> bool | None:
    """Return whether a run expected to change its workspace left it as it started (None: not known or not asked)."""
    if not config.expects_changes:
        return None
    start = snapshots.start_fingerprint(run)
    if start and final.fingerprint:
        return bool(start == final.fingerprint)
    return None


def _judge(run: Any, config: Config, answer: str, checks: Sequence[policy.Check], *, stop: Any, meter: Any) -> Verdict:
    """Ask the LLM judge of the answer and the run's diff, against the configured rubric."""
    return judge_mod.judge(
        run.instance,
        objective=run.objective,
        criteria=config.judge_criteria,
        answer=answer,
        checks=checks,
        diff=snapshots.diff(run, max_chars=judge_mod.DIFF_CHARS),
        model=config.judge_model,
        pass_threshold=config.judge_pass_threshold,
        stop=stop,
        meter=meter,
    )


def tamper_reason(run: Any) -> str:
    """Return why the run's changes to non-test code touch the test machinery ("" when they do not).

    A scan of the Python files the run changed (`loops.tamper`): an `os._exit`, an exit at import,
    `atexit`, a patched `unittest`/`pytest`/`builtins`, a write into `sys.modules`. The first
    line found leads, for the reviewer.
    """
    if not run.instance.checks:
        return ""
    findings = tamper.scan(*snapshots.changed_sources(run))
    if not findings:
        return ""
    first = findings[0]
    more = f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""
    return redact(
        f"it touches the test machinery: {first.path}:{first.line} {first.what}: `{first.text.strip()}`{more}"
    )


def _record(run: Any, final: Any, result: Grade) -> Grade:
    GradeRecord.objects.update_or_create(
        run_id=run.pk,
        iteration=final.number,
        defaults={**result.as_json(), "usage": result.usage.as_json()},
    )
    return result


def on_done_proposed(*, run: Any, final: FinalAct, checks: Any, stop: Any = None, meter: Any = None) -> Grade:
    """Grade a done the loop proposes (the `loops.grading.CONFIGURED` grader)."""
    return grade(run, final, checks, stop=stop, meter=meter)
