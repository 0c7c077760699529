"""Rank transfer from proxy trials to full-size runs (issue 52, item 2), from three directories of runs:

- ``--proxy SWEEP_DIR``: the proxy sweep a law is fitted on (a sweep file with ``proxy:``);
- ``--full SWEEP_DIR``: full-size trials of the same space, the held-out mixtures (``--set proxy=null``);
- ``--proxy-at-full DIR``: one proxy run per held-out mixture (``DIR/<trial number>/``), the raw proxy outcome there.

It writes ``OUT/transfer.csv``: one row per run, a ``w_<task>`` column per weight of the swept simplex, a column per
target (``<split>/<task>/<metric>`` at the last stage, read from each run's ``summary.json``) and ``held_out`` (1 for
the full-size trials), for ``harness mixture --table OUT/transfer.csv --holdout-column held_out`` — (a), the law
fitted on the proxies predicting the held-out full-size outcomes, per target. It prints (b): per target, Spearman's
ρ between the proxy's own outcome at each held-out mixture and the full-size one, with its 95 % percentile
bootstrap interval over the mixtures (``analysis.mixture_holdout.agreement``), and each directory's trials per hour.
Only the rank correlations carry over: a proxy's losses sit on another scale than the full-size ones, so the RMSE
that ``harness mixture --holdout-column`` prints beside (a)'s ρ measures that offset, not the law.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import polars as pl

from analysis.loading import load_sweep, read_sweep_config
from analysis.mixture_holdout import agreement
from analysis.trials import complete, simplex_groups


def last_stage_targets(run_dir: Path, metric: str) -> dict[str, float]:
    """``{<split>/<task>/<metric>: value}`` at the run's last stage: the loss pool's splits for a loss target, the
    evaluation splits (heldout, heldout_template) for greedy."""
    stages = json.loads((run_dir / "summary.json").read_text())["stages"]
    return {
        f"{split}/{task}/{metric}": values[metric]
        for split, tasks in stages[-1]["metrics"].items()
        if split.startswith("loss_") is (metric != "greedy") and not split.startswith(("train", "bench"))
        for task, values in tasks.items()
        if values.get(metric) is not None
    }


def sweep_rows(sweep_dir: Path, trials: pl.DataFrame, metric: str, held_out: int) -> list[dict]:
    """A row per complete trial: ``run`` (the trial number), its weights, ``held_out`` and its targets."""
    path, tasks = list(simplex_groups(trials, read_sweep_config(sweep_dir).get("space")).items())[-1]
    return [
        {"run": t["number"], **{f"w_{task}": t[f"param/{path}.{task}"] for task in tasks}, "held_out": held_out}
        | last_stage_targets(sweep_dir / "trials" / str(t["number"]), metric)
        for t in trials.iter_rows(named=True)
    ]


def per_hour(trials: pl.DataFrame) -> str:
    if "duration_s" not in trials.columns or not trials.height:
        return "?"
    seconds = float(np.median(trials["duration_s"].to_numpy()))
    return f"median {seconds / 60:.1f} min per trial, {3600 / seconds:.1f} trials per hour per worker"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proxy", type=Path, required=True)
    ap.add_argument("--full", type=Path, required=True)
    ap.add_argument("--proxy-at-full", type=Path, required=True)
    ap.add_argument("--metric", default="eval_loss", help="eval_loss, gold_logprob or greedy")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resamples", type=int, default=2000)
    args = ap.parse_args()
    proxy_trials, full_trials = complete(load_sweep(args.proxy)), complete(load_sweep(args.full))
    fit = sweep_rows(args.proxy, proxy_trials, args.metric, 0)
    full = sweep_rows(args.full, full_trials, args.metric, 1)
    table = pl.DataFrame(fit + full)
    args.out.mkdir(parents=True, exist_ok=True)
    table.write_csv(args.out / f"transfer_{args.metric}.csv")
    targets = sorted(c for c in table.columns if "/" in c)
    print(f"{len(fit)} proxy trials (fit), {len(full)} full-size trials (held out); targets: {len(targets)}")
    print(f"proxy: {per_hour(proxy_trials)}; full: {per_hour(full_trials)}")
    print("(b) the proxy's own outcome at each held-out mixture against the full-size one: Spearman rho [95 %]")
    at_full = {  # the proxy's targets at each held-out mixture (by the full-size trial's number), read once
        r["run"]: last_stage_targets(args.proxy_at_full / str(r["run"]), args.metric)
        for r in full
        if (args.proxy_at_full / str(r["run"]) / "summary.json").is_file()
    }
    for target in targets:
        pairs = [(at_full[r["run"]].get(target), r.get(target)) for r in full if r["run"] in at_full]
        pairs = [(p, f) for p, f in pairs if p is not None and f is not None]
        if len(pairs) < 4:
            print(f"  {target:<40} fewer than 4 mixtures with both")
            continue
        a = agreement(*map(np.array, zip(*pairs)), resamples=args.resamples, seed=0)
        print(f"  {target:<40} {a['rho']:6.3f} [{a['rho_low']:.3f}, {a['rho_high']:.3f}]  n {len(pairs)}")


if __name__ == "__main__":
    main()
