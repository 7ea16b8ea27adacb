"""Signals the budgets app sends.

`threshold_crossed(sender=Pool, crossing=ThresholdCrossing)`: a pool's settled spend
reached its soft threshold, once per period; sent after the settling transaction commits.
"""

from django.dispatch import Signal

threshold_crossed = Signal()
