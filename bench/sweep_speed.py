"""Sweep speed with the stage cache off and on, side by side: the same sweep (by default
``experiments/sweeps/yesno_vs_qa.yaml``, whose trials share the quickstart's first two stages and differ in the
last stage's mixture), the same sampler seed and trial count, each side in a fresh ``HARNESS_CACHE`` (so the "on"
side pays for filling the cache: no head start) holding only the pretrained base, built once beforehand.

Reported per side: wall time, trials per hour, training steps actually run, steps replayed from the stage cache,
and per trial number the objective values, which must be identical (same sampler seed, one worker: the same
parameters in the same order; two workers may interleave trials differently, so they are compared by parameters).

Run from the repository root::

    python bench/sweep_speed.py                                  # 8 trials, 2 workers (long on 2 CPU cores)
    python bench/sweep_speed.py --trials 3 --workers 1 \\
        --set overrides.stages.repeat_only.steps=20 --set overrides.stages.short.steps=20 \\
        --set overrides.stages.assistant.steps=20 --set overrides.eval.every=10   # a quick look
    python bench/sweep_speed.py --micro --trials 2 --workers 1   # that the bench runs: ~5 min on 2 busy cores

``--micro`` (the :data:`MICRO` overrides of ``yesno_vs_qa``: 4-step pretraining and stages, pools of 40 / 4 items,
one eval split) checks the machinery — the second trial replays the first's two shared stages, the objective values
agree — not the speed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# --micro: the default sweep at a size that only checks the bench runs (its numbers say nothing about speed).
MICRO = [
    "overrides.model.pretrain.steps=4",
    "overrides.eval.every=2",
    "overrides.eval.splits=[heldout_template]",
    *(f"overrides.stages.{stage}.steps=4" for stage in ("repeat_only", "short", "assistant")),
    *(
        f"overrides.tasks.{task}.{pool}={size}"
        for task in ("repeat", "identity", "yesno", "short_qa", "assistant_qa", "math")
        for pool, size in (("train", 40), ("eval", 4))
    ),
]


def run_side(sweep_file: Path, out: Path, cache: Path, stage_cache: bool, args) -> dict:
    """One sweep in a subprocess; its wall time and what its trials report."""
    command = [
        sys.executable,
        "-m",
        "harness",
        "sweep",
        str(sweep_file),
        "--workers",
        str(args.workers),
        "--out",
        str(out),
        "--set",
        f"study.n_trials={args.trials}",
        "--set",
        f"overrides.train.stage_cache={str(stage_cache).lower()}",
    ]
    for item in args.set or []:
        command += ["--set", item]
    started = time.perf_counter()
    result = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "HARNESS_CACHE": str(cache), "WANDB_MODE": "disabled"},
    )
    wall = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"sweep (stage_cache={stage_cache}) failed:\n{result.stderr[-3000:]}")
    return {"wall_s": wall, "trials": _trials(sweep_file, out, args.set)}


def _trials(sweep_file: Path, sweep_dir: Path, overrides) -> list[dict]:
    from harness.studies.sweep import load_sweep
    from harness.studies.sweep.worker import load_worker_study

    spec = load_sweep(sweep_file, overrides)
    study = load_worker_study(spec, sweep_dir, 0)
    return [
        {
            "number": t.number,
            "state": t.state.name,
            "values": t.values,
            "params": json.dumps(t.params, sort_keys=True),
            "steps": int(t.user_attrs.get("steps", 0)),
            "cached_steps": int(t.user_attrs.get("cached_steps", 0)),
        }
        for t in study.get_trials(deepcopy=False)
    ]


def _warm_base(sweep_file: Path, cache: Path, args) -> None:
    """Pretrain the base once into ``cache`` (one untimed trial with the stage cache off)."""
    scratch = Path(tempfile.mkdtemp(prefix="sweep-speed-warm-"))
    run_side(
        sweep_file, scratch / "warm", cache, False, argparse.Namespace(workers=1, trials=1, set=list(args.set or []))
    )
    shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", type=Path, default=ROOT / "experiments" / "sweeps" / "yesno_vs_qa.yaml")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--set", action="append", help="Passed to harness sweep --set (e.g. shorter stages).")
    parser.add_argument("--out", type=Path, default=None, help="Where both sweeps go (default: a temp dir).")
    parser.add_argument(
        "--micro",
        action="store_true",
        help="The default sweep at micro size (MICRO overrides, before any --set): checks the bench "
        "runs, measures nothing.",
    )
    parser.add_argument(
        "--base-from",
        type=Path,
        default=None,
        help="A HARNESS_CACHE whose base/ already holds the sweep's pretrained base (skips the "
        "untimed warm-up trial; a wrong base is simply pretrained again inside both sides).",
    )
    args = parser.parse_args()
    if args.micro:
        args.set = MICRO + (args.set or [])
    out = args.out or Path(tempfile.mkdtemp(prefix="sweep-speed-"))
    warm = args.base_from or out / "cache-warm"
    if args.base_from is None:
        _warm_base(args.sweep, warm, args)  # untimed
    sides = {}
    for stage_cache in (False, True):
        cache = out / f"cache-{'on' if stage_cache else 'off'}"
        shutil.copytree(warm / "base", cache / "base")  # the base only: the "on" side starts with no stages
        sides[stage_cache] = run_side(
            args.sweep, out / f"sweep-{'on' if stage_cache else 'off'}", cache, stage_cache, args
        )
    print(f"{'stage cache':<12} {'wall s':>8} {'trials/h':>9} {'steps run':>10} {'steps cached':>13}")
    for stage_cache, side in sides.items():
        trials = [t for t in side["trials"] if t["state"] in ("COMPLETE", "PRUNED")]
        cached = sum(t["cached_steps"] for t in trials)
        print(
            f"{'on' if stage_cache else 'off':<12} {side['wall_s']:>8.1f} {3600 * len(trials) / side['wall_s']:>9.1f}"
            f" {sum(t['steps'] for t in trials) - cached:>10} {cached:>13}"
        )
    print(
        f"speed-up (trials per hour, on / off): {sides[False]['wall_s'] / sides[True]['wall_s']:.2f}x "
        f"(n = {args.trials} trials per side, one run each: no interval)"
    )
    off = {t["params"]: t for t in sides[False]["trials"]}
    on = {t["params"]: t for t in sides[True]["trials"]}
    shared = sorted(set(off) & set(on))
    same = sum(off[p]["values"] == on[p]["values"] for p in shared)
    print(
        f"identical objective values: {same} of {len(shared)} trials with the same parameters on both sides "
        "(with two workers, pruning depends on which trials finished first: a trial pruned on one side may "
        "complete on the other)"
    )
    compared = [
        _same_store_values(
            out / "sweep-off" / "trials" / str(off[p]["number"]), out / "sweep-on" / "trials" / str(on[p]["number"])
        )
        for p in shared
    ]
    print(
        f"identical store values at the steps both twins reached: {sum(a == b for a, b in compared)} of "
        f"{len(compared)} twins ({sum(a for a, _ in compared)} of {sum(b for _, b in compared)} values)"
    )


def _same_store_values(trial_a: Path, trial_b: Path) -> tuple[int, int]:
    """``(identical, compared)``: evaluation values of two trials' stores (with their n and Wilson interval) at the
    (step, task, split, metric) keys both have, wall-clock metrics left out."""
    import polars as pl

    def values(trial: Path) -> dict:
        frame = pl.read_parquet(trial / "metrics.parquet").filter(
            pl.col("split").is_not_null(),
            pl.col("value").is_not_null(),
            ~pl.col("metric").is_in(["tokens_per_s", "duration_s"]),
        )
        return {
            (r["step"], r["task"], r["split"], r["metric"]): (r["value"], r["n"], r["ci_low"], r["ci_high"])
            for r in frame.iter_rows(named=True)
        }

    a, b = values(trial_a), values(trial_b)
    common = set(a) & set(b)
    return sum(a[k] == b[k] for k in common), len(common)


if __name__ == "__main__":
    main()
