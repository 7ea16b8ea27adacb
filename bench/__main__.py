"""`make bench`: every benchmark, one after the other, each printing its own table.

Figures are ratios against baselines measured in the same run (these machines are shared
and noisy); none of this is a test.
"""

import importlib
import sys

SUITES = [
    "loop_bench", "ledger_bench", "context_bench", "console_bench", "sandbox_bench", "metering_bench", "pickup_bench",
    "rollback_bench", "stall_bench", "tracing_bench",
]

if __name__ == "__main__":
    chosen = sys.argv[1:] or SUITES
    if unknown := [name for name in chosen if name not in SUITES]:
        sys.exit(
            f"unknown benchmark {unknown[0]!r}; choose from {', '.join(SUITES)} "
            "(a suite's own flags, such as --json, go to it directly: python -m bench.loop_bench --json)"
        )
    for name in chosen:
        print(f"\n===== bench.{name}", flush=True)
        importlib.import_module(f"bench.{name}").main()
