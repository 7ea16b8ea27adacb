# The audit trail's table was created by `reviews` (0001, 0003) and is adopted here as it is:
# `reviews` 0004 gives up the model, this migration takes it, and the database is not touched.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('reviews', '0005_auditentry_to_audit_app'),
        ('instances', '0013_protect_defaults'),
        ('budgets', '0008_quota_leases'),
        ('loops', '0007_evidence_baseline'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(database_operations=[], state_operations=[migrations.CreateModel(
            name='AuditEntry',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('username', models.CharField(blank=True, help_text='kept when the user is deleted', max_length=150)),
                ('action', models.CharField(db_index=True, max_length=60)),
                ('run_ref', models.PositiveBigIntegerField(blank=True, help_text="the run's id, kept after deletion", null=True)),
                ('pool_ref', models.PositiveBigIntegerField(blank=True, null=True)),
                ('detail', models.JSONField(blank=True, default=dict)),
                ('via', models.CharField(choices=[('api', 'Api'), ('console', 'Console'), ('cli', 'Cli'), ('admin', 'Admin'), ('system', 'System'), ('mcp', 'Mcp')], max_length=10)),
                ('user_agent', models.CharField(blank=True, max_length=400)),
                ('ip_address', models.GenericIPAddressField(blank=True, null=True)),
                ('created_at', models.DateTimeField(db_index=True)),
                ('pool', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='audit_entries', to='budgets.pool')),
                ('run', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='audit_entries', to='loops.run')),
                ('user', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('instance', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='audit_entries', to='instances.instance')),
                ('instance_ref', models.PositiveBigIntegerField(blank=True, db_index=True, null=True)),
                ('owner', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'verbose_name_plural': 'audit entries',
                'db_table': 'reviews_auditentry',
                'ordering': ['-created_at', '-id'],
            },
        )]),
    ]
