"""Seed groups (``harness run --seeds``): per-task final scores across replicates and seesaw events that recur.

- :func:`final_scores`: for every task × split, each seed's final score (the last stage's last evaluation), their
  mean with a 95 % interval across seeds (``across_low`` / ``across_high``; ``across`` says how it was made): for a
  rate, one that accounts for both the seeds and the items they share (:func:`harness.core.stats.seeds_items_interval`
  on the per-item outcomes of ``samples.jsonl``, :func:`~harness.core.stats.seeds_rates_interval` when a run has
  none), inside [0, 1] and never zero-width while items vary; for a value whose samples carry per-item values
  (``eval_loss``, ``gold_logprob``) the same two-way crossed interval on them, uncut
  (:func:`harness.core.stats.crossed_interval`); for other values a Student-t interval over the seeds; none from one
  seed ("none: one seed" — its Wilson interval is the within-run one). Next to it the 95 % Wilson
  interval one run of ``n`` items would give at that mean (``within_low`` / ``within_high``: how much it moves
  between eval pools of that size), the eval pool's
  baseline (best constant answer, majority first token or chance: the items are the same in every seed) and
  ``above_in`` = ``k/N``, the replicates whose final score is significantly above it (each run's one-sided exact
  binomial test, Benjamini–Hochberg over its tasks at α = 0.05, as the run report decides it);
- :func:`choice_scores`: for every two-answer task × split (yes/no), each seed's final ``choice_auc`` (the ranking of
  P(Yes) between true and false statements) with its score interval and p-value, their mean with a t-interval,
  and ``above_half_in`` = ``k/N``, the replicates whose AUC is significantly above 0.5 (its interval's lower end
  above 0.5);
- :func:`recurring_events`: seesaw events matched across seeds on (split, rose task, fell task, stage transition),
  with ``recurs_in`` = ``k/N`` — the number of replicates in which the event happened.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from analysis.frames import final_against_baselines
from analysis.loading import AnalysisError, PathLike, load_run, load_samples, read_summary
from harness.core.metrics import GROUP_FILE, METRICS, PROPORTION
from harness.core.stats import (
    Interval,
    crossed_interval,
    seeds_items_interval,
    seeds_rates_interval,
    t_interval,
    wilson_interval,
)


def is_group_dir(path: PathLike) -> bool:
    return (Path(path) / GROUP_FILE).is_file()


def read_group(group_dir: PathLike) -> dict[str, Any]:
    path = Path(group_dir) / GROUP_FILE
    if not path.is_file():
        raise AnalysisError(f"{group_dir}: not a seed group (no {GROUP_FILE}; made by harness run --seeds)")
    return json.loads(path.read_text())


def replicate_runs(group_dir: PathLike) -> dict[int, Path]:
    """``{seed: run directory}`` of the replicates that finished (wrote ``summary.json``), in seed order."""
    group = read_group(group_dir)
    runs = {int(s): Path(group_dir) / name for s, name in group["replicates"].items()}
    done = {s: d for s, d in sorted(runs.items()) if (d / "summary.json").is_file()}
    if not done:
        raise AnalysisError(f"{group_dir}: no replicate has finished yet (no seed-*/summary.json)")
    return done


def _item_counts(run_dir: Path) -> dict[tuple[str, str], int]:
    """Items per task × split at the run's last evaluation (from ``samples.jsonl``)."""
    samples = load_samples(run_dir, lazy=True)
    last = samples.select(pl.col("step").max()).collect().item()
    counts = samples.filter(pl.col("step") == last).group_by("task", "split").len().collect()
    return {(r["task"], r["split"]): r["len"] for r in counts.iter_rows(named=True)}


def _above_baseline(run_dir: Path, metric: str, splits: set[str]) -> dict[tuple[str, str], tuple[float, bool]]:
    """``{(split, task): (baseline, significantly above)}`` of one replicate's final ``metric``."""
    frame, out = load_run(run_dir), {}
    for split in sorted(splits):
        tested = final_against_baselines(frame, metric, split)
        for r in tested.iter_rows(named=True):
            out[(split, r["task"])] = (r["baseline"], bool(r["above"]))
    return out


def _final_outcomes(run_dir: Path, metric: str) -> dict[tuple[str, str], dict[int, float]]:
    """``{(split, task): {item index: value}}`` of ``metric`` at the run's last evaluation (samples' ``outcomes``:
    0/1 for a proportion, a real value for a loss target)."""
    samples = load_samples(run_dir)
    if samples.is_empty() or "outcomes" not in samples.columns:
        return {}
    last = samples.filter(pl.col("step") == samples["step"].max())
    out: dict[tuple[str, str], dict[int, float]] = {}
    for r in last.select("split", "task", "index", "outcomes").iter_rows(named=True):
        value = (r["outcomes"] or {}).get(metric)
        if value is not None:
            out.setdefault((r["split"], r["task"]), {})[int(r["index"])] = float(value)
    return out


def _is_proportion(metric: str, outcomes: dict[int, dict[int, float]]) -> bool:
    """A proportion by its declaration, or — undeclared here — by the per-item outcomes the runs stored (runs store
    proportions' and the declared loss targets'): a plug-in's metric counts although this process has not imported
    the plug-in."""
    if metric in METRICS:
        return METRICS.get(metric).kind == PROPORTION
    return any(outcomes.values())


def _across(
    metric: str, values: dict[int, float], outcomes: dict[int, dict[int, float]], n: int | None
) -> tuple[Interval, str]:
    """The across-seed interval of one task × split and how it was made."""
    if len(values) < 2:
        return Interval(next(iter(values.values()), float("nan")), float("nan"), float("nan"), n or 0), "none: one seed"
    items = [outcomes.get(seed) for seed in values]
    same = all(items) and all(i.keys() == items[0].keys() for i in items)
    if not _is_proportion(metric, outcomes):
        if not same:
            return t_interval(list(values.values())), "t over seeds"
        order = sorted(items[0])
        mean, low, high = crossed_interval([[i[k] for k in order] for i in items])
        return Interval(mean, low, high, len(order)), "seeds × items (real values)"
    if same:
        order = sorted(items[0])
        return seeds_items_interval([[i[k] for k in order] for i in items]), "seeds × items"
    if n:
        return seeds_rates_interval(list(values.values()), n), "seeds × items (from rates)"
    return Interval(float("nan"), float("nan"), float("nan"), 0), "none: no item count"


def final_scores(group_dir: PathLike, metric: str = "greedy") -> pl.DataFrame:
    """One row per split × task: ``seeds`` (replicates with a value), ``mean``, ``across_low``/``across_high``
    and ``across`` (the interval across seeds and how it was made; see the module docstring), ``n`` (items per
    run), ``within_low``/``within_high`` (one run's Wilson interval at the mean), ``baseline`` and ``above_in``
    (``k/N``: of the N seeds that logged baselines, k are significantly above it; both null without a baseline)
    and ``values`` (per seed)."""
    per_seed: dict[tuple[str, str], dict[int, float]] = {}
    outcomes: dict[tuple[str, str], dict[int, dict[int, float]]] = {}
    counts: dict[tuple[str, str], int] = {}
    tested: dict[tuple[str, str], dict[int, tuple[float, bool]]] = {}
    for seed, run_dir in replicate_runs(group_dir).items():
        final = read_summary(run_dir)["stages"][-1]["metrics"]
        for split, tasks in final.items():
            for task, values in tasks.items():
                if metric in values:
                    per_seed.setdefault((split, task), {})[seed] = float(values[metric])
        counts.update({(s, t): n for (t, s), n in _item_counts(run_dir).items()})
        for key, items in _final_outcomes(run_dir, metric).items():
            outcomes.setdefault(key, {})[seed] = items
        for key, result in _above_baseline(run_dir, metric, set(final)).items():
            tested.setdefault(key, {})[seed] = result
    rows = []
    for (split, task), values in sorted(per_seed.items()):
        n = counts.get((split, task))
        items = outcomes.get((split, task), {})
        across, how = _across(metric, values, items, n)
        mean = sum(values.values()) / len(values)
        within = wilson_interval(round(mean * n), n) if n and _is_proportion(metric, items) else None
        base = tested.get((split, task), {})
        rows.append(
            {
                "split": split,
                "task": task,
                "seeds": len(values),
                "mean": mean,
                "across_low": across.low,
                "across_high": across.high,
                "across": how,
                "n": n,
                "within_low": within.low if within else None,
                "within_high": within.high if within else None,
                "baseline": max(b for b, _ in base.values()) if base else None,
                "above_in": f"{sum(a for _, a in base.values())}/{len(base)}" if base else None,
                "values": ", ".join(f"{s}: {v:.3f}" for s, v in values.items()),
            }
        )
    return pl.DataFrame(rows)


def choice_scores(group_dir: PathLike) -> pl.DataFrame:
    """One row per split × two-answer task: ``seeds``, ``mean`` AUC with ``t_low`` / ``t_high`` across seeds,
    ``above_half_in`` (``k/N``: seeds whose final ``choice_auc`` interval lies above 0.5), the mean answered-Yes
    share ``yes_share`` and, per seed, ``AUC [low, high] p``."""
    per_seed: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for seed, run_dir in replicate_runs(group_dir).items():
        final = read_summary(run_dir)["stages"][-1]
        for split, tasks in final["metrics"].items():
            for task, values in tasks.items():
                if "choice_auc" in values:
                    ci = final.get("intervals", {}).get(split, {}).get(task, {}).get("choice_auc", {})
                    per_seed.setdefault((split, task), {})[seed] = {
                        "auc": values["choice_auc"],
                        "low": ci.get("ci_low"),
                        "high": ci.get("ci_high"),
                        "p": values.get("choice_auc_p"),
                        "yes": values.get("choice_yes"),
                    }
    rows = []
    for (split, task), seeds in sorted(per_seed.items()):
        across = t_interval([v["auc"] for v in seeds.values()])
        above = sum(v["low"] is not None and v["low"] > 0.5 for v in seeds.values())
        yes = [v["yes"] for v in seeds.values() if v["yes"] is not None]
        rows.append(
            {
                "split": split,
                "task": task,
                "seeds": len(seeds),
                "mean": across.estimate,
                "t_low": None if across.low != across.low else max(0.0, across.low),
                "t_high": None if across.high != across.high else min(1.0, across.high),
                "above_half_in": f"{above}/{len(seeds)}",
                "yes_share": sum(yes) / len(yes) if yes else None,
                "values": ", ".join(
                    f"{s}: {v['auc']:.3f} [{v['low']:.2f}, {v['high']:.2f}] p={v['p']:.2g}"
                    for s, v in seeds.items()
                    if v["low"] is not None and v["p"] is not None
                ),
            }
        )
    return pl.DataFrame(rows)


def _transition(event: dict[str, Any]) -> str:
    a, b = event.get("stage_from"), event.get("stage_to")
    return a if a == b else f"{a}→{b}"


def recurring_events(group_dir: PathLike) -> pl.DataFrame:
    """Seesaw events of every replicate, matched on (split, rose, fell, stage transition): ``recurs_in`` (``k/N``
    over the finished replicates), ``seeds``, the metrics they fired on, the mean rise and fall, and the largest
    ``p_value`` when the runs' events carry one. Most recurrent first."""
    runs = replicate_runs(group_dir)
    matched: dict[tuple[str, str, str, str], list[tuple[int, dict]]] = {}
    for seed, run_dir in runs.items():
        for event in read_summary(run_dir).get("seesaw_events", []):
            key = (event["split"], event["rose"], event["fell"], _transition(event))
            matched.setdefault(key, []).append((seed, event))
    rows = []
    for (split, rose, fell, transition), hits in matched.items():
        seeds = sorted({s for s, _ in hits})
        p_values = [e["p_value"] for _, e in hits if e.get("p_value") is not None]
        rows.append(
            {
                "split": split,
                "stages": transition,
                "rose": rose,
                "fell": fell,
                "recurs_in": f"{len(seeds)}/{len(runs)}",
                "k": len(seeds),
                "seeds": ", ".join(map(str, seeds)),
                "metrics": ", ".join(sorted({e["metric"] for _, e in hits})),
                "rose_by": sum(e["rose_by"] for _, e in hits) / len(hits),
                "fell_by": sum(e["fell_by"] for _, e in hits) / len(hits),
                "max_p_value": max(p_values) if p_values else None,
            }
        )
    if not rows:
        return pl.DataFrame(
            schema={
                "split": pl.Utf8,
                "stages": pl.Utf8,
                "rose": pl.Utf8,
                "fell": pl.Utf8,
                "recurs_in": pl.Utf8,
                "k": pl.Int64,
                "seeds": pl.Utf8,
                "metrics": pl.Utf8,
                "rose_by": pl.Float64,
                "fell_by": pl.Float64,
                "max_p_value": pl.Float64,
            }
        )
    return pl.DataFrame(rows).sort(["k", "split", "stages"], descending=[True, False, False])
