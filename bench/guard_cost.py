"""What the non-finite guard and the health metrics cost, paired inside one process: tokens per wall second and per
CPU second of the training thread.

``bench/train_speed.py``'s ``harness-noguard`` / ``harness-nodiag`` / ``harness-bare`` lines measure the same
thing, each configuration in a fresh process, by wall time: right on an idle machine, and unable to resolve a few
per cent on a shared one, where the wall time of back-to-back runs varies by tens of per cent. Here the bench's
inputs and the stage's batches (``train.packing: auto``, as the bench's ``harness`` line) are prepared once, then
:func:`harness.training.loop.train_stage` trains a fresh copy of the model under each configuration in turn (rounds
of ``harness``, ``noguard``, ``nodiag``, ``bare``), and each step is timed twice: by the wall clock and by the CPU
time of the training thread (with one torch thread, all of a step's work), which time spent waiting for the CPU does
not count. A first, untimed stage takes the process's one-off costs, which would otherwise fall on the first
configuration of the first round.

Run from the repository root (``--code DIR``: the harness of another checkout instead, e.g. the commit before a
change, ``git archive <commit> | tar -x -C DIR``)::

    python bench/guard_cost.py --rounds 4 --steps 25
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = {
    "harness": {},
    "noguard": {"nonfinite": {"action": "off"}},
    "nodiag": {"diagnostics": False},
    "bare": {"nonfinite": {"action": "off"}, "diagnostics": False},
}


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[1], help="repository root")
    parser.add_argument("--workdir", type=Path, help="bench/train_speed.py's prepared inputs (made here if absent)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=25, help="optimiser steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="the clock starts at the end of step warmup + 1")
    parser.add_argument("--json", type=Path, help="also write every run's numbers here")
    return parser.parse_args()


def stage_inputs(args):
    """The bench's model, its first stage, and that stage's first ``--steps`` batches as the runner makes them."""
    from bench.train_speed import arguments as bench_arguments
    from bench.train_speed_inputs import load_inputs, load_model, prepare, quiet
    from harness.data.stage_batches import plan_stage
    from harness.runs.execution.packing_decision import stage_batches
    from harness.runs.planning.prepare import stage_batching

    quiet()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="guard-cost-"))
    if not (workdir / "tokenizer").exists():
        prepare(workdir, bench_arguments().parse_args([]))
    exp, pools = load_inputs(workdir, {})
    model, tokenizer = load_model(workdir, "cpu")
    stage = exp.resolved_stages()[0]
    plan = plan_stage(stage_batching(exp), stage, 0, pools, tokenizer.pad_token_id)
    plan.batches, plan.examples = plan.batches[: args.steps], plan.examples[: args.steps]
    batches = stage_batches(plan, model, list(exp.tasks), tokenizer.pad_token_id, 0, lambda rows, step: None)
    return model, stage, list(exp.tasks), batches


def timed_run(model, stage, tasks, batches, overrides: dict, warmup: int) -> dict:
    """One stage on a fresh copy of ``model``: real tokens per wall second and per CPU second after ``warmup``."""
    from harness.config import NonFiniteSpec
    from harness.training.loop import StageLoop, train_stage

    update = {k: NonFiniteSpec(**v) if k == "nonfinite" else v for k, v in overrides.items()}
    wall, cpu = [], []

    def progress(n):
        wall.append(time.perf_counter())
        cpu.append(time.thread_time())

    loop = StageLoop(
        stage.name, 0, tasks, lambda rows, step: None, lambda step: None, stage.train, progress=progress, **update
    )
    train_stage(copy.deepcopy(model), batches, loop)
    tokens = sum(b.n_real_tokens for b in batches[warmup + 1 : len(wall)])
    return {"wall_tps": tokens / (wall[-1] - wall[warmup]), "cpu_tps": tokens / (cpu[-1] - cpu[warmup])}


def main() -> None:
    args = arguments()
    sys.path.insert(0, str(args.code.resolve()))
    import torch

    import harness

    torch.set_num_threads(1)  # one thread: the training thread's CPU time is all of a step's work
    print(f"harness from {Path(harness.__file__).parent}; {args.rounds} rounds of {args.steps} steps")
    model, stage, tasks, batches = stage_inputs(args)
    # untimed: a process's first stage pays one-off costs (allocator, lazy initialisation) the others do not
    timed_run(model, stage, tasks, batches, CONFIGS["harness"], args.warmup)
    runs: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for r in range(args.rounds):
        for name, overrides in CONFIGS.items():
            runs[name].append(timed_run(model, stage, tasks, batches, overrides, args.warmup))
            got = runs[name][-1]
            print(f"round {r + 1} {name:<8} {got['wall_tps']:>8.0f} tok/s wall  {got['cpu_tps']:>8.0f} tok/CPU s")
    print("\nrelative to harness (guard and health metrics on): median over rounds of each round's ratio [min, max]")
    for name in ("noguard", "nodiag", "bare"):
        for measure in ("wall_tps", "cpu_tps"):
            ratios = [a[measure] / b[measure] for a, b in zip(runs[name], runs["harness"])]
            print(
                f"  {name:<8} {measure:<9} {statistics.median(ratios):.3f}×  "
                f"[{min(ratios):.3f}, {max(ratios):.3f}]  n={len(ratios)}"
            )
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
