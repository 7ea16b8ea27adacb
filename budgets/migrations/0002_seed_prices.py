"""Seed the price table with Anthropic's published per-million-token prices.

Cache writes are the 5-minute rate (1.25x input), cache reads 0.1x input. A row's
`model` is a prefix: the longest matching row prices a dated model name.
"""

import datetime
from decimal import Decimal

from django.db import migrations

SINCE = datetime.date(2025, 1, 1)

# model prefix: (input, output, cache write, cache read) in USD per million tokens
PRICES = {
    "claude-opus-4-6": ("5", "25", "6.25", "0.50"),
    "claude-opus-4-5": ("5", "25", "6.25", "0.50"),
    "claude-opus-4-1": ("15", "75", "18.75", "1.50"),
    "claude-opus-4": ("15", "75", "18.75", "1.50"),
    "claude-sonnet-4-5": ("3", "15", "3.75", "0.30"),
    "claude-sonnet-4": ("3", "15", "3.75", "0.30"),
    "claude-3-7-sonnet": ("3", "15", "3.75", "0.30"),
    "claude-3-5-sonnet": ("3", "15", "3.75", "0.30"),
    "claude-haiku-4-5": ("1", "5", "1.25", "0.10"),
    "claude-3-5-haiku": ("0.80", "4", "1", "0.08"),
    "claude-3-haiku": ("0.25", "1.25", "0.30", "0.03"),
}


def seed(apps, schema_editor):
    Price = apps.get_model("budgets", "Price")
    for model, (inp, out, write, read) in PRICES.items():
        Price.objects.update_or_create(
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
    dependencies = [("budgets", "0001_initial")]

    operations = [migrations.RunPython(seed, unseed)]
