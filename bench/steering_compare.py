"""Steering against the seesaw (issue 32, docs/steering.md): natural vs the best fixed mixture of a sweep vs each
adaptive method, on the seesaw reproduction's setup — ``experiments/repro/steering`` run by ``harness repro``'s
machinery, then compared here.

Per arm (3 seeds by default): each task's greedy on ``heldout_template`` (the split where the seesaw shows; held-out
people stay at baseline) — mean over seeds with its 95 % t-interval (n = seeds) and the rate pooled over seeds and
items with its Wilson interval (n = items × seeds); the *balanced* score (the worse task's greedy, per seed) with a
t-interval over seeds and a hierarchical bootstrap interval over seeds and items; and compute (training tokens
actually drawn, from the store's ``mix_tokens``, and wall seconds — contaminated on a shared machine).

"The best fixed mixture a sweep finds" is chosen two ways: in-sample (the fixed arm with the best mean balanced
score over all seeds: optimistic, the winner's curse) and leave-one-seed-out (for each seed, the arm best on the
other seeds, scored on this one: what a sweep would deliver on a fresh seed). The claim under test — an adaptive stage
reaches the sweep's best balanced score within its interval at the cost of one trial — is the paired difference
adaptive − best-fixed (leave-one-seed-out) across seeds with its t-interval.

    python bench/steering_compare.py --micro                      # minutes: checks the pipeline, numbers meaningless
    python bench/steering_compare.py --seeds 0,1,2 --jobs 2       # the real comparison (13 arms × 3 seeds)

Finished runs under ``--out`` are reused (``harness repro``'s rule), so an interrupted comparison continues, and a
second call only recomputes the tables.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import polars as pl

from harness.core.stats import t_interval, wilson_interval
from harness.core.store import read_metrics
from harness.studies.repro.plan import load_repro, parse_seeds, run_repro

SPLIT = "heldout_template"
TASKS = ("assistant_qa", "yesno")
ADAPTIVE = ("odm", "doremi", "groupdro", "odm_all", "doremi_all")


def _label(task: str) -> str:
    return f"{task}/{SPLIT}/greedy"


def _ci(values: list[float]) -> tuple[float, float, float]:
    ci = t_interval(values, 0.95)
    return ci.estimate, ci.low, ci.high


def _bootstrap_balanced(outcomes: list, rng: np.random.Generator, draws: int = 2000) -> tuple[float, float]:
    """95 % percentile interval of the mean balanced score, resampling seeds, then items within each seed."""
    per_seed = [[np.array(list(o.items.get(_label(t), {}).values()), dtype=float) for t in TASKS] for o in outcomes]
    if not per_seed or any(len(x) == 0 for seed in per_seed for x in seed):
        return math.nan, math.nan
    stats = []
    for _ in range(draws):
        chosen = rng.integers(0, len(per_seed), len(per_seed))
        stats.append(np.mean([min(x[rng.integers(0, len(x), len(x))].mean() for x in per_seed[s]) for s in chosen]))
    return float(np.percentile(stats, 2.5)), float(np.percentile(stats, 97.5))


def _tokens(run_dir: str) -> tuple[float, float]:
    """(training tokens of the whole run, of its last stage): ``mix_tokens`` rows (drawn examples' tokens)."""
    frame = read_metrics(run_dir).filter(pl.col("metric") == "mix_tokens")
    last = frame.sort("step")["stage"][-1] if frame.height else None
    return float(frame["value"].sum()), float(frame.filter(pl.col("stage") == last)["value"].sum())


def arm_table(outcomes: list, rng: np.random.Generator) -> dict[str, dict]:
    """Per arm: per-task and balanced scores with their intervals, and compute."""
    table = {}
    for arm in dict.fromkeys(o.arm for o in outcomes):
        mine = [o for o in outcomes if o.arm == arm]
        row: dict = {"seeds": [o.seed for o in mine]}
        for task in TASKS:
            values = [o.values[_label(task)] for o in mine]
            right = sum(sum(o.items.get(_label(task), {}).values()) for o in mine)
            n = sum(len(o.items.get(_label(task), {})) for o in mine)
            wilson = wilson_interval(int(right), int(n), 0.95) if n else None
            row[task] = {
                "t": _ci(values),
                "pooled": (right / n if n else math.nan),
                "wilson": (wilson.low, wilson.high) if wilson else (math.nan, math.nan),
                "n": n,
            }
        balanced = [min(o.values[_label(t)] for t in TASKS) for o in mine]
        row["balanced"] = {"per_seed": balanced, "t": _ci(balanced), "bootstrap": _bootstrap_balanced(mine, rng)}
        tokens = [_tokens(o.run_dir) for o in mine]
        row["tokens_run"], row["tokens_last_stage"] = np.mean([t[0] for t in tokens]), np.mean([t[1] for t in tokens])
        row["seconds"] = float(np.mean([o.seconds for o in mine]))
        table[arm] = row
    return table


def best_fixed(table: dict[str, dict], fixed: list[str]) -> dict:
    """The sweep's best fixed arm: in-sample, and leave-one-seed-out per seed."""
    seeds = table[fixed[0]]["seeds"]
    score = {a: dict(zip(table[a]["seeds"], table[a]["balanced"]["per_seed"])) for a in fixed}
    in_sample = max(fixed, key=lambda a: np.mean(list(score[a].values())))
    loso = {}
    for s in seeds:
        others = [x for x in seeds if x != s] or [s]
        pick = max(fixed, key=lambda a: np.mean([score[a][x] for x in others]))
        loso[s] = {"arm": pick, "score": score[pick][s]}
    return {"in_sample": in_sample, "loso": loso, "loso_t": _ci([v["score"] for v in loso.values()])}


def claims(table: dict[str, dict], best: dict) -> dict[str, dict]:
    """Adaptive − best fixed (leave-one-seed-out), paired by seed: mean and 95 % t-interval."""
    out = {}
    for arm in [a for a in ADAPTIVE if a in table]:
        mine = dict(zip(table[arm]["seeds"], table[arm]["balanced"]["per_seed"]))
        diffs = [mine[s] - best["loso"][s]["score"] for s in best["loso"] if s in mine]
        out[arm] = {"diffs": diffs, "t": _ci(diffs)}
    return out


def _fmt(ci: tuple) -> str:
    est, lo, hi = ci
    return f"{est:.3f} [{lo:.3f}, {hi:.3f}]" if not math.isnan(lo) else f"{est:.3f}"


def markdown(table: dict, best: dict, claim: dict, fixed: list[str], command: str) -> str:
    lines = [
        f"# Steering against the seesaw: {SPLIT} greedy",
        "",
        f"`{command}`",
        "",
        "| arm | "
        + " | ".join(f"{t} (t over seeds; pooled, Wilson, n)" for t in TASKS)
        + " | balanced (t over seeds) | balanced (bootstrap seeds×items) | tokens, last stage | s |",
        "|---|" + "---|" * (len(TASKS) + 4),
    ]
    for arm, row in table.items():
        cells = [
            f"{_fmt(row[t]['t'])}; {row[t]['pooled']:.3f} [{row[t]['wilson'][0]:.3f}, {row[t]['wilson'][1]:.3f}]"
            f" n={row[t]['n']}"
            for t in TASKS
        ]
        lo, hi = row["balanced"]["bootstrap"]
        lines.append(
            f"| {arm} | " + " | ".join(cells) + f" | {_fmt(row['balanced']['t'])} | [{lo:.3f}, {hi:.3f}] | "
            f"{row['tokens_last_stage']:.0f} | {row['seconds']:.0f} |"
        )
    sweep_tokens = sum(table[a]["tokens_last_stage"] for a in fixed)
    lines += [
        "",
        f"Best fixed mixture, in-sample: **{best['in_sample']}** (optimistic). Leave-one-seed-out: "
        + ", ".join(f"seed {s} → {v['arm']} ({v['score']:.3f})" for s, v in best["loso"].items())
        + f"; balanced {_fmt(best['loso_t'])}.",
        f"Compute of the last stage: the sweep of {len(fixed)} fixed trials drew {sweep_tokens:.0f} tokens; "
        "one adaptive trial draws about 1/{0} of that.".format(len(fixed)),
        "",
    ]
    for arm, c in claim.items():
        lines.append(
            f"- {arm} − best fixed (leave-one-seed-out), balanced, paired by seed: {_fmt(c['t'])} "
            f"(per seed {', '.join(f'{d:+.3f}' for d in c['diffs'])})"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the reproduction's steps")
    parser.add_argument("--micro", action="store_true", help="the repro's micro size (checks the pipeline)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--arms", default=None, help="comma-separated (default: every non-optional arm)")
    parser.add_argument("--out", type=Path, default=Path("runs/repro/steering"))
    args = parser.parse_args()
    repro = load_repro("steering")
    arms = args.arms.split(",") if args.arms else None
    outcomes = run_repro(repro, parse_seeds(args.seeds), args.out, args.scale, args.micro, arms, print, args.jobs)
    table = arm_table(outcomes, np.random.default_rng(0))
    fixed = [a for a in table if a.startswith("yesno_")]
    best = best_fixed(table, fixed)
    claim = claims(table, best)
    command = "python bench/steering_compare.py " + " ".join(
        [f"--seeds {args.seeds}"]
        + ([f"--scale {args.scale:g}"] if args.scale != 1 else [])
        + (["--micro"] if args.micro else [])
        + ([f"--arms {args.arms}"] if args.arms else [])
    )
    text = markdown(table, best, claim, fixed, command)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "steering_compare.md").write_text(text)
    (args.out / "steering_compare.json").write_text(
        json.dumps({"table": table, "best_fixed": best, "claims": claim}, indent=2, default=float)
    )
    print(text)


if __name__ == "__main__":
    main()
