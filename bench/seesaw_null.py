"""False-event rate under the null and detection rate of a planted effect, for the untested rule, the paired rule
without its correction and the paired rule (Benjamini-Hochberg over the run's tests), each with its 95 % Wilson
interval and n.

Null: the quickstart's schedule (6 tasks, 3 splits, 11 intervals, 20 % of items changing outcome between
evaluations, accuracy stationary at --accuracy) at the pool sizes given by --items. Planted: task 0 +size and
task 1 −size at interval 5, in every split, on top of the same noise. Rates are per run: a null run counts when it
reports ≥ 1 event; a planted run counts as found when it reports the planted (task 0 ↑, task 1 ↓) pair at its
interval, and as a false alarm when it reports any other event (harness.core.seesaw_sim.false_events: a later
drift back of a planted task is a real change, not counted).

    python bench/seesaw_null.py [--runs 1000] [--items 24 200] [--delta 0.15 0.03] [--size 0.4] [--alpha 0.05]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from harness.core.seesaw_sim import Planted, Schedule, false_events, found_planted, simulate_run
from harness.core.stats import wilson_interval

RULES = ("none", "uncorrected", "paired")


def rate_text(count: int, runs: int) -> str:
    rate = wilson_interval(count, runs)
    return f"{rate.estimate:6.3f} [{rate.low:.3f}, {rate.high:.3f}] n={runs}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--items", type=int, nargs="+", default=[24, 200])
    parser.add_argument("--delta", type=float, nargs="+", default=[0.15, 0.03])
    parser.add_argument("--size", type=float, default=0.4)
    parser.add_argument("--accuracy", type=float, default=0.5)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    planted = Planted(size=args.size)
    print(
        f"runs per cell {args.runs}, accuracy {args.accuracy}, α={args.alpha}, planted ±{args.size} at interval "
        f"{planted.interval}; rate [95 % Wilson interval] n"
    )
    print(
        f"{'items':>5}  {'δ':>5}  {'rule':<11}  {'null: runs with ≥1 event':<32}  {'events/run':>10}  "
        f"{'planted found':<32}  planted runs with a false event"
    )
    for items in args.items:
        for delta in args.delta:
            rng = np.random.default_rng([args.seed, items, int(1000 * delta)])
            schedule = Schedule(items=items, accuracy=args.accuracy)
            started = time.perf_counter()
            null = [simulate_run(schedule, rng, delta=delta, alpha=args.alpha) for _ in range(args.runs)]
            found = [
                simulate_run(schedule, rng, delta=delta, alpha=args.alpha, planted=planted) for _ in range(args.runs)
            ]
            for rule in RULES:
                fired = sum(bool(run[rule]) for run in null)
                per_run = np.mean([len(run[rule]) for run in null])
                hits = sum(found_planted(run[rule], planted) for run in found)
                false = sum(bool(false_events(run[rule], planted)) for run in found)
                print(
                    f"{items:>5}  {delta:>5}  {rule:<11}  {rate_text(fired, args.runs):<32}  {per_run:>10.2f}  "
                    f"{rate_text(hits, args.runs):<32}  {rate_text(false, args.runs)}"
                )
            print(f"       ({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
