"""The audit trail: every person's action that changes what agents may do or spend, with who, when and how.

Below every app that acts for a person (instances, budgets' pools, loops, reviews, triggers): they
call `audit.trail.record` inside the transaction of the action (with `snapshot`/`changes` for before
and after, and the one admin hook `audit.trail.AuditedAdmin` mixed into their admins); this app
imports none of them (its entry names a run, a pool, an instance and an owner by foreign key and
reference). The actions are `audit.trail.ACTIONS`. Reads: `audit.trail.audit_for_run`,
`audit_for_pool`, `audit_for_instance`, `audit_for_person`, `visible_to`, `for_page`; `write_csv`
exports (the CSV page is `reviews.views.audit_csv`).
"""
