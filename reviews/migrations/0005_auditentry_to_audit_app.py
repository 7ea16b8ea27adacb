# The audit trail moved to its own app (`audit`), below the apps that record into it. Its table
# stays where it is (`reviews_auditentry`, the `db_table` of `audit.AuditEntry`): only Django's
# state of which app owns the model changes; the database is not touched.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("reviews", "0004_audit_instance_owner"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="AuditEntry")],
            database_operations=[],
        ),
    ]
