"""The budget curve of ``harness mixture SWEEP_DIR --verify K --budget k …``: how many trials does the mixing law
need? For each budget ``k``, the mixture ``harness mixture`` gives from the sweep's first ``k`` trials (the law's
proposal, or the winner among them where ``k`` trials are too few to fit a law; :func:`analysis.mixture_proposal.
budget_choice`) is trained on the same K fresh seeds as the full sweep's proposal and winner
(:mod:`harness.studies.mixture_verify`: the same seeds, the same fresh data seed, the same items) and compared with
the full sweep's winner, paired by seed (and by item where the objective is itemised).

The family of comparisons is the budgets' rows, the full sweep's proposal ("all") included: each difference is
given with its 95 % interval and with the interval Bonferroni-adjusted over that family (level 1 − 0.05/m), and a
row is called *worse* only when its adjusted interval lies wholly on the worse side of 0. With few seeds the
adjusted intervals are wide: "not significantly worse" then says little, and the report prints the widths.

Runs go to ``SWEEP_DIR/verify/budget-<k>/seed-<s>/``; an arm whose mixture is another arm's (a budget's winner that
is the full sweep's winner) is not trained twice. ``budget.json`` in the sweep directory holds the report (written
atomically); :func:`format_budget` is the table the command prints.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from harness.core.jsonl import json_safe
from harness.core.stats import CONFIDENCE
from harness.core.store import atomic_write_text
from harness.studies.launch import Launcher
from harness.studies.mixture_verify import (
    Arm,
    ArmScores,
    arm_experiment,
    arm_scores,
    arms,
    fresh_seeds,
    itemised,
    paired_difference,
    run_arms,
    run_dir,
)
from harness.studies.sweep.space import Sweep

BUDGET_NAME = "budget.json"
MIXTURE_TOLERANCE = 1e-9  # two arms with the same weights up to float rounding are one arm


def _same_mixture(a: Arm, b: Arm) -> bool:
    if a.values.keys() != b.values.keys():
        return False
    for key, value in a.values.items():
        other = b.values[key]
        if isinstance(value, dict):
            if value.keys() != other.keys() or any(abs(value[t] - other[t]) > MIXTURE_TOLERANCE for t in value):
                return False
        elif value != other:
            return False
    return True


def budget_arms(sweep: Sweep, full: dict[str, Any], rows: list[dict[str, Any]], trials: list[dict[str, Any]]):
    """The arms to train (the full sweep's proposal and winner first) and each row's arm name: a row whose mixture
    is an earlier arm's uses that arm."""
    chosen = arms(sweep, full, trials)
    names: list[Optional[str]] = []
    for row in rows:
        if row["mixture"] is None:  # no trial of the budget completed: nothing to train
            names.append(None)
            continue
        candidate = arms(sweep, {"path": row["path"], "mixture": row["mixture"], "winner": full["winner"]}, trials)[0]
        same = next((a for a in chosen if _same_mixture(a, candidate)), None)
        if same is None:
            same = Arm(f"budget-{row['k']}", candidate.values)
            chosen.append(same)
        names.append(same.name)
    return chosen, names


def verify_budget(
    sweep: Sweep,
    sweep_dir: Path,
    full: dict[str, Any],
    rows: list[dict[str, Any]],
    trials: list[dict[str, Any]],
    k: int,
    launcher: Optional[Launcher] = None,
    echo: Callable[[str], None] = print,
) -> Optional[dict[str, Any]]:
    """Train every budget's mixture on the verification's ``k`` fresh seeds (reusing finished runs), compare each
    with the full sweep's winner and write ``budget.json``; None when the launcher left the runs going."""
    seeds, data_seed = fresh_seeds(sweep, trials, k)
    support = "supported" if full.get("supported") else "NOT SUPPORTED"
    rows = rows + [
        {
            "k": "all",
            "basis": "law",
            "why": f"{full.get('chosen')}, {support}",
            "mixture": full["mixture"],
            "path": full["path"],
            "n_complete": full.get("n_trials"),
            "winner": full["winner"],
        }
    ]
    chosen, names = budget_arms(sweep, full, rows, trials)
    plan = [(arm.name, s, arm_experiment(sweep, arm, s, data_seed)) for s in seeds for arm in chosen]
    done, how = run_arms(sweep, sweep_dir, plan, launcher, echo)
    if not done:
        return None
    objective = sweep.objectives[0]
    notes: list[str] = []
    scores = {arm.name: arm_scores(objective, sweep_dir, arm.name, seeds, notes) for arm in chosen}
    crossed = itemised(list(scores.values()), notes)
    compared = sum(name is not None for name in names)
    adjusted = 1.0 - (1.0 - CONFIDENCE) / compared
    report_rows = [
        _compared(row, name, scores, crossed, adjusted, objective.direction == "maximize")
        for row, name in zip(rows, names)
    ]
    report = {
        "sweep_dir": str(sweep_dir),
        "objective": objective.describe(),
        "direction": objective.direction,
        "seeds": seeds,
        "data_seed": data_seed,
        "interval": ("seeds × items" if crossed else "t over seeds") if len(seeds) > 1 else "none: one seed",
        "family": f"Bonferroni over the {compared} rows compared (budgets and all) against the full sweep's winner, "
        f"level {adjusted:.4f}",
        "winner": {
            "trial": full["winner"]["number"],
            "values": scores["winner"].values,
            "mean": float(np.mean(scores["winner"].values)),
            "in_sample": full["winner"]["observed"],
        },
        "rows": report_rows,
        "runs": {
            name: {str(s): {"run_dir": str(run_dir(sweep_dir, name, s)), "how": how[f"{name} seed {s}"]} for s in seeds}
            for name in scores
        },
        "notes": notes,
    }
    atomic_write_text(Path(sweep_dir) / BUDGET_NAME, json.dumps(json_safe(report), indent=2) + "\n")
    return report


def _compared(
    row: dict[str, Any],
    name: Optional[str],
    scores: dict[str, ArmScores],
    crossed: bool,
    adjusted: float,
    maximize: bool,
) -> dict[str, Any]:
    """One budget's row: what was trained, its fresh-seed values and its difference from the full sweep's winner
    at 95 % and at the family's adjusted level; *worse* when the whole adjusted interval is on the worse side."""
    kept = {key: row[key] for key in ("k", "basis", "why", "n_complete", "mixture")} | {
        "in_sample_winner": row["winner"]
    }
    if name is None:
        nothing = {"estimate": None, "low": None, "high": None}
        return {
            **kept,
            "arm": None,
            "values": [],
            "mean": None,
            "difference": nothing,
            "adjusted": nothing,
            "worse": None,
        }
    diff = paired_difference(scores[name], scores["winner"], crossed)
    wide = paired_difference(scores[name], scores["winner"], crossed, adjusted)
    worse = wide[2] < 0 if maximize else wide[1] > 0
    return {
        **kept,
        "arm": name,
        "values": scores[name].values,
        "mean": float(np.mean(scores[name].values)),
        "difference": {"estimate": diff[0], "low": diff[1], "high": diff[2]},
        "adjusted": {"low": wide[1], "high": wide[2]},
        "worse": bool(worse) if len(scores[name].values) > 1 else None,
    }


def _ci(low: Optional[float], high: Optional[float]) -> str:
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return "[no interval]"
    return f"[{low:+.4f}, {high:+.4f}]"


def format_budget(report: dict[str, Any]) -> str:
    """The budget curve as a table: per budget, what was trained, its fresh-seed mean and its difference from the
    full sweep's winner with the 95 % and the family-adjusted intervals."""
    w = report["winner"]
    lines = [
        f"budget curve on fresh seeds {', '.join(map(str, report['seeds']))}: {report['objective']}",
        f"full sweep's winner (trial {w['trial']}): in-sample {w['in_sample']:.4f}, fresh seeds {w['mean']:.4f}",
        f"{'k':>4} {'trained':<34} {'fresh mean':>10} {'− winner':>9}  95 % interval       adjusted",
    ]
    for r in report["rows"]:
        d, a = r["difference"], r["adjusted"]
        if r["arm"] is None:
            lines.append(f"{r['k']!s:>4} nothing: {r['why']}")
            continue
        what = f"{r['basis']} ({r['why']})" if r["basis"] == "law" else f"winner of {r['n_complete']} complete"
        verdict = {True: "  worse", False: "", None: ""}[r["worse"]]
        lines.append(
            f"{r['k']!s:>4} {what[:34]:<34} {r['mean']:>10.4f} {d['estimate']:>+9.4f}  {_ci(d['low'], d['high'])} "
            f"{_ci(a['low'], a['high'])}{verdict}"
        )
    lines.append(f"intervals: {report['interval']}; {report['family']}")
    lines += [f"note: {n}" for n in report.get("notes", [])]
    return "\n".join(lines)
