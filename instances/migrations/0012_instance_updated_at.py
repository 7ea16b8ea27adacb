import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("instances", "0011_fill_shipped_template_fields")]

    operations = [
        migrations.AddField(
            model_name="instance",
            name="updated_at",
            field=models.DateTimeField(auto_now=True, default=django.utils.timezone.now),
            preserve_default=False,
        ),
    ]
