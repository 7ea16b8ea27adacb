"""The console's pages and form posts (namespace `loops`)."""

from django.urls import path

from web.console import account, instances, tokens, views
from web.console import receipts as receipt_views

app_name = "loops"

urlpatterns = [
    path("", views.fleet, name="fleet"),
    path("instances/<int:instance_id>/", views.instance_detail, name="instance-detail"),
    path("instances/<int:instance_id>/start", views.run_start, name="run-start"),
    path("instances/new/", instances.instance_new, name="instance-new"),
    path("instances/new/<slug:template>/", instances.instance_create, name="instance-create"),
    path("instances/<int:instance_id>/edit", instances.instance_edit, name="instance-edit"),
    path("instances/<int:instance_id>/duplicate", instances.instance_duplicate, name="instance-duplicate"),
    path("instances/<int:instance_id>/archive", instances.instance_archive, name="instance-archive"),
    path("instances/<int:instance_id>/restore", instances.instance_restore, name="instance-restore"),
    path("instances/<int:instance_id>/budget", instances.instance_budget, name="instance-budget"),
    path("pools/<int:pool_id>/", instances.pool_detail, name="pool-detail"),
    path("account/", account.account, name="account"),
    path("credentials/", instances.credentials, name="credentials"),
    path("credentials/<int:credential_id>/remove", instances.credential_remove, name="credential-remove"),
    path("runs/<int:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<int:run_id>/stop", views.run_stop, name="run-stop"),
    path("runs/<int:run_id>/interject", views.run_interject, name="run-interject"),
    path("runs/<int:run_id>/close", views.run_close, name="run-close"),
    path("runs/<int:run_id>/resume", views.run_resume, name="run-resume"),
    path("runs/<int:run_id>/continue", views.run_continue, name="run-continue"),
    path("runs/<int:run_id>/rollback", views.run_rollback, name="run-rollback"),
    path("runs/<int:run_id>/timeline", views.run_timeline, name="run-timeline"),
    path("runs/<int:run_id>/costs", views.run_costs, name="run-costs"),
    path("runs/<int:run_id>/receipt", receipt_views.receipt_page, name="run-receipt"),
    path("runs/<int:run_id>/receipt.json", receipt_views.receipt_download, name="run-receipt-download"),
    path("history/", views.history, name="history"),
    path("tokens/", tokens.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke", tokens.token_revoke, name="token-revoke"),
]
