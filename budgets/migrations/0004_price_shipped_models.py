"""Price the models the shipped templates and the Claude brain's default name.

`claude-sonnet-5-5` (the default, `coder`, `pilot`) at the Sonnet-class rates of
`claude-sonnet-4-5`; `claude-haiku-5-5` (`triage`) at the Haiku-class rates of
`claude-haiku-4-5`. Without them a fresh install would refuse those instances.
"""

import datetime
from decimal import Decimal

from django.db import migrations

SINCE = datetime.date(2025, 1, 1)
# model: (input, output, cache write (5-minute), cache read) in USD per million tokens
PRICES = {
    "claude-sonnet-5-5": ("3", "15", "3.75", "0.30"),
    "claude-haiku-5-5": ("1", "5", "1.25", "0.10"),
}


def seed(apps, schema_editor):
    Price = apps.get_model("budgets", "Price")
    for model, (inp, out, write, read) in PRICES.items():
        Price.objects.get_or_create(
            model=model,
            effective_from=SINCE,
            defaults={
                "input_usd_per_mtok": Decimal(inp),
                "output_usd_per_mtok": Decimal(out),
                "cache_write_usd_per_mtok": Decimal(write),
                "cache_read_usd_per_mtok": Decimal(read),
            },
        )


def unseed(apps, schema_editor):
    apps.get_model("budgets", "Price").objects.filter(model__in=PRICES, effective_from=SINCE).delete()


class Migration(migrations.Migration):
    dependencies = [("budgets", "0003_metered_calls")]

    operations = [migrations.RunPython(seed, unseed)]
