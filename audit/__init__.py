"""The audit trail: every human action, with who, when, and from which device and interface.

Below every app that acts for a person (instances, budgets' pools, loops, reviews): they call
`audit.trail.record` inside the transaction of the action; this app imports none of them (its
entry names a run and a pool by reference). Reads: `audit.trail.audit_for_run`, `audit_for_pool`,
`visible_to`; `write_csv` exports (the CSV page is `reviews.views.audit_csv`).
"""
