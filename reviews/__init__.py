"""Stopping is not succeeding: graders, the review queue, receipts, the audit trail, notifications.

The loop calls four hooks; each is idempotent and none holds a transaction across I/O:

- `reviews.snapshots.take(run)` — in the worker before the first act (iteration 1), outside any
  transaction: snapshot the workspace (a tree in a shadow git directory, and a fingerprint).
- `reviews.graders.grade(run, final_iteration, checks) -> Grade` — in the worker when the policy
  says `done`, before `_record`: then `step = grade.apply(step)` and add `grade.usage` (the judge's
  model call) to the iteration's usage. `final_iteration` is a `graders.FinalAct(number, response,
  fingerprint)`. `grade.as_event(number)` is the `grade.finished` event for the timeline.
- `reviews.services.on_run_finished(run)` — after the commit that finished a run, or that made it
  wait for a person (`transaction.on_commit`): end snapshot, review queue, receipt, notifications.
  Never raises.
- `reviews.audit.record(*, user, action, run=None, pool=None, detail, request=None, via)` — inside the
  transaction of every human action (start, interject, answer, stop, resume, close, budget changes,
  credentials).

Pages: `/reviews/` (queue), `/reviews/<item>/` (diff first, verdict), `/reviews/audit.csv`; API:
`GET /v1/instances/{id}/loop/{run}/receipt`; CLI: `python manage.py loop verify-receipt FILE`.
For the console: `reviews.selectors.fleet_stats(user)` with `reviews/_trust.html`,
`reviews.audit.audit_for_run(run)` with `reviews/_audit.html`, `reviews.selectors.pending_count(user)`.
"""
