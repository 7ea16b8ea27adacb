"""Stopping is not succeeding: graders, the review queue, receipts, notifications.

The loop's runner does not import this app: it sends `loops.signals`, and `ReviewsConfig.ready`
connects (and registers):

- `run_starting` → `reviews.snapshots.take(run)` — in the worker before the first act, outside any
  transaction: snapshot the workspace (a tree in a shadow git directory, and a fingerprint), once no
  rollback is writing it (`reviews.rollback.wait_for_rollback`; `iteration_starting` waits the same way).
- and registers `reviews.graders.on_done_proposed` with `loops.grading` as the `CONFIGURED` grader
  (after the composition's role check) — in the worker when the policy would say `done`: returns a `Grade`, whose `assessment` the loop feeds to `loops.policy.verdict` (the one
  place "done / verified" is decided) and whose `usage` (the judge's model call) it adds to the
  iteration's cost; `grade.as_event(number)` is the `grade.finished` event for the timeline.
- `run_finished` → `reviews.services.on_run_finished(run_id)` — after the commit that finished a run,
  or that made it wait for a person: end snapshot, review queue, receipt, notifications. Never raises.

Every person's action that changes what agents may do or spend (start, interject, answer, stop,
resume, close, verdicts, budget changes, credentials, rollbacks…; `audit.trail.ACTIONS`) is recorded
by `audit.trail.record` inside its transaction, and admins here mix in `audit.trail.AuditedAdmin`:
the audit trail is its own app, below this one and the loop, so recording imports nothing of either.

The loop's surfaces (REST, console, MCP, CLI) call this app directly for one thing:
- `reviews.rollback.points(run)`, `plan(run=, to=)`, `rollback(run=, user=, to=, via=, request=)` — a
  person rolling a run's workspace back to one of its snapshots.

Periodic work: one django-q2 schedule (`tether-review-watch`, made by a migration) runs
`reviews.tasks.watch_and_digest` every 5 minutes: `reviews.watch.notify_alerts` (review items that
wait too long or pile up) and `reviews.digest.send_due` (each person's daily or weekly digest).

Pages: `/reviews/` (queue, backlog, rubber-stamp signals), `/reviews/<item>/` (diff first, verdict;
opening it records `diff_opened_at`), `/reviews/<item>/reopen`, `/reviews/digest/` (since you last
looked), `/reviews/digest/settings` (from the account page), `/reviews/audit.csv`; API:
`GET /v1/instances/{id}/loop/{run}/receipt`; CLI: `python manage.py loop verify-receipt FILE`.
For the console: `reviews.selectors.fleet_stats(user)` with `reviews/_trust.html`,
`audit.trail.audit_for_run(run)` / `for_page(...)` with `reviews/_audit.html`, `reviews.selectors.pending_count(user)`.
"""
