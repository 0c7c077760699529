"""The budget curve of ``harness mixture SWEEP_DIR --verify K --budget k …``: how many trials does the mixing law
need? For each budget ``k``, the mixture ``harness mixture`` gives from the sweep's first ``k`` trials (the law's
proposal, or the winner among them where ``k`` trials are too few to fit a law; :func:`analysis.mixture_proposal.
budget_choice`) is trained on the same K fresh seeds as the full sweep's proposal and winner
(:mod:`harness.studies.mixture_verify`: the same seeds, the same fresh data seed, the same items) and compared with
the full sweep's winner, paired by seed (and by item where the objective is itemised).

Each budget's arm keeps the other swept values (a learning rate, a stage length) of its own first-``k`` winner, as a
researcher who stopped there would. The family of comparisons is the distinct arms compared with the full sweep's
winner (the budgets' and the full sweep's proposal, "all"; a budget whose arm *is* the winner compares nothing):
each difference is given with its 95 % interval and with the two-sided interval Bonferroni-adjusted over that
family (level 1 − 0.05/m); a row is called *worse* only when that interval lies wholly on the worse side of 0 — a
one-sided test at 0.025/m, conservative. With few seeds the adjusted intervals are wide: "not significantly worse"
then says little, and the table prints the widths.

Runs go to ``SWEEP_DIR/verify/budget-<k>/seed-<s>/``; an arm whose values are another arm's (a budget's winner that
is the full sweep's winner) is not trained twice. ``budget.json`` in the sweep directory holds the report (written
atomically); :func:`format_budget` is the table the command prints.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    distinct_arms,
    format_ci,
    fresh_seeds,
    interval_kind,
    itemised,
    own_seed_notes,
    paired_difference,
    run_arms,
    run_records,
    same_values,
    winner_summary,
)
from harness.studies.sweep.space import Sweep

BUDGET_NAME = "budget.json"


def budget_arms(sweep: Sweep, full: dict[str, Any], rows: list[dict[str, Any]], trials: list[dict[str, Any]]):
    """The arms to train (the full sweep's proposal and winner first) and each row's arm name (None: nothing to
    train). A row's arm keeps the other swept values (a learning rate, a stage length) of *its own* in-sample winner,
    what a researcher who stopped after ``k`` trials would have; a row whose arm is an earlier one's uses it."""
    chosen = distinct_arms(arms(sweep, full, trials))
    names: list[str | None] = []
    for row in rows:
        if row["mixture"] is None:  # no trial of the budget completed: nothing to train
            names.append(None)
            continue
        own = {"path": row["path"], "mixture": row["mixture"], "winner": row["winner"]}
        candidate = arms(sweep, own, trials)[0]
        same = next((a for a in chosen if same_values(a, candidate)), None)
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
    launcher: Launcher | None = None,
    echo: Callable[[str], None] = print,
) -> dict[str, Any] | None:
    """Train every row's mixture on the verification's ``k`` fresh seeds (finished runs reused: the verification,
    run first, trained the winner and the proposal), compare each with the full sweep's winner and write
    ``budget.json``; None when the launcher left the runs going."""
    seeds, data_seed = fresh_seeds(sweep, trials, k)
    chosen, names = budget_arms(sweep, full, rows, trials)
    plan = [(arm.name, s, arm_experiment(sweep, arm, s, data_seed)) for arm in chosen for s in seeds]
    done, how = run_arms(sweep, sweep_dir, plan, launcher, echo)
    if not done:
        return None
    objective = sweep.objectives[0]
    notes: list[str] = own_seed_notes(sweep)
    scores = {arm.name: arm_scores(objective, sweep_dir, arm.name, seeds, notes) for arm in chosen}
    crossed = itemised(list(scores.values()))
    # the family: the distinct comparisons made (a row whose arm is the winner itself compares nothing)
    family = sorted({name for name in names if name not in (None, "winner")})
    adjusted = 1.0 - (1.0 - CONFIDENCE) / max(len(family), 1)
    maximize = objective.direction == "maximize"
    report = {
        "sweep_dir": str(sweep_dir),
        "objective": objective.describe(),
        "direction": objective.direction,
        "seeds": seeds,
        "data_seed": data_seed,
        "interval": interval_kind(crossed, len(seeds)),
        "family": f"Bonferroni over the {len(family)} arms compared with the full sweep's winner "
        f"({', '.join(family)}): two-sided level {adjusted:.4f}; 'worse' is read from it (one-sided at "
        f"{(1 - adjusted) / 2:.4f}, conservative)",
        "winner": winner_summary(full, scores["winner"]),
        "rows": [_compared(row, name, scores, crossed, adjusted, maximize) for row, name in zip(rows, names)],
        "runs": {name: run_records(sweep_dir, name, seeds, how) for name in scores},
        "notes": notes,
    }
    atomic_write_text(Path(sweep_dir) / BUDGET_NAME, json.dumps(json_safe(report), indent=2) + "\n")
    return report


def _compared(
    row: dict[str, Any],
    name: str | None,
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
    if name == "winner":  # the budget kept the full sweep's winner: the same runs, 0 by construction
        diff = wide = (0.0, 0.0, 0.0)
    else:
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


def format_budget(report: dict[str, Any]) -> str:
    """The budget curve as a table: per budget, what was trained, its fresh-seed mean and its difference from the
    full sweep's winner with the 95 % and the family-adjusted intervals."""
    w = report["winner"]
    lines = [
        f"budget curve on fresh seeds {', '.join(map(str, report['seeds']))}: {report['objective']}",
        f"full sweep's winner (trial {w['trial']}): in-sample {w['in_sample']:.4f}, fresh seeds {w['mean']:.4f}",
        f"{'k':>4} {'trained':<40} {'fresh mean':>10} {'− winner':>9}  95 % interval       adjusted",
    ]
    for r in report["rows"]:
        d, a = r["difference"], r["adjusted"]
        if r["arm"] is None:
            lines.append(f"{r['k']!s:>4} nothing: {r['why']}")
            continue
        what = f"{r['basis']} ({r['why']})" if r["basis"] == "law" else f"winner of {r['n_complete']} complete"
        what += " = the winner" if r["arm"] == "winner" else ""
        verdict = {True: "  worse", False: "", None: ""}[r["worse"]]
        ci, wide = format_ci(d["low"], d["high"]), format_ci(a["low"], a["high"])
        lines.append(f"{r['k']!s:>4} {what:<40} {r['mean']:>10.4f} {d['estimate']:>+9.4f}  {ci} {wide}{verdict}")
    lines.append(f"intervals: {report['interval']}; {report['family']}")
    lines += [f"note: {n}" for n in report.get("notes", [])]
    return "\n".join(lines)
