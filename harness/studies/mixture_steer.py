"""Steering judged as a sweep's pick is judged: ``harness mixture SWEEP_DIR --verify K --steer groupdro``. Each
adaptive method named trains *one* arm — the sweep's winner's other swept values, its swept mixture replaced by the
method over the same tasks from the uniform start (what a researcher knows without a sweep) — on the verification's
K fresh seeds and fresh data seed (:mod:`harness.studies.mixture_verify`), and is compared on the same seeds and
items with the full sweep's winner (what steering must match) and with its own start held fixed (the uniform mixture,
trained on the same seeds: what steering adds): each paired difference with its interval (seeds × items where the
objective is itemised), Bonferroni-adjusted over those two comparisons per method, and the cost (one run against the
sweep's trials).

A method that reads the signal ``steering_error`` (``groupdro``) steers by the sweep's own objective — its metric on
a steering split imitating the objective's split, disjoint from every pool the run reports
(:mod:`harness.runs.planning.steering_split`); the others read the training loss. Runs go to
``SWEEP_DIR/verify/steer-<method>/seed-<s>/`` (the fixed start's to ``verify/start-uniform/``); the report to
``steer.json`` (atomic); :func:`format_steering` is the
table the command prints.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.config.mixture import STEERING_METRICS, STEERING_SPLITS
from harness.core.jsonl import json_safe
from harness.core.registry import MIXTURE_CONTROLLERS
from harness.core.stats import CONFIDENCE
from harness.core.store import atomic_write_text
from harness.studies.launch import Launcher
from harness.studies.mixture_verify import (
    Arm,
    arm_experiment,
    arm_scores,
    arms,
    format_ci,
    fresh_seeds,
    interval_kind,
    itemised,
    own_seed_notes,
    paired_difference,
    run_arms,
    run_records,
    winner_summary,
)
from harness.studies.sweep.space import Sweep

STEER_NAME = "steer.json"
START_ARM = "start-uniform"


def steering_mixture(method: str, tasks: list[str], objective) -> dict[str, Any]:
    """The adaptive mixture of a steered arm: ``method`` over ``tasks`` from the uniform start; a method that can
    read ``steering_error`` reads it, measured with the objective's metric on a split imitating the objective's."""
    spec: dict[str, Any] = {"method": method, "tasks": list(tasks), "start": {t: 1.0 / len(tasks) for t in tasks}}
    if "steering_error" in MIXTURE_CONTROLLERS.get(method).signals:
        spec.update(signal="steering_error", steering={"split": objective.split, "metric": objective.metric})
    return {"adaptive": spec}


def steered_arms(winner: Arm, path: str, methods: list[str], objective) -> list[Arm]:
    """One arm per method: the winner's swept values with its swept mixture (at ``path``) steered."""
    tasks = list(winner.values[path])
    return [Arm(f"steer-{m}", {**winner.values, path: steering_mixture(m, tasks, objective)}) for m in methods]


def start_arm(winner: Arm, path: str) -> Arm:
    """The steered arms' start held fixed (the uniform mixture, the winner's other values): what steering adds."""
    tasks = list(winner.values[path])
    return Arm(START_ARM, {**winner.values, path: {t: 1.0 / len(tasks) for t in tasks}})


@dataclass
class SteeringPlan:
    """What ``--steer`` trains: the steered arms, with the winner and the fixed start beside them, each arm's
    experiment on each fresh seed (``runs``: ``(arm, seed, Experiment)``, built — so validated — before anything
    trains), and the notes on what the methods optimise."""

    steered: list[Arm]
    runs: list[tuple[str, int, Any]]
    seeds: list[int]
    data_seed: int
    notes: list[str]


def steering_plan(
    sweep: Sweep, full: dict[str, Any], trials: list[dict[str, Any]], methods: list[str], k: int
) -> SteeringPlan:
    """The plan of ``--steer``, checked before anything trains: each method once; ValueError (one line) where a
    method that reads ``steering_error`` cannot measure the objective (its metric or split, or a minimised
    objective), or an arm's experiment does not validate; notes where the objective is not what the method
    optimises (a mean, or tasks beside the steered ones)."""
    methods = list(dict.fromkeys(methods))
    objective = sweep.objectives[0]
    readers = [m for m in methods if "steering_error" in MIXTURE_CONTROLLERS.get(m).signals]
    notes = []
    if readers:
        what = f"--steer {readers[0]}: the objective {objective.describe()}"
        if objective.metric not in STEERING_METRICS or objective.split not in STEERING_SPLITS:
            raise ValueError(
                f"{what} cannot be measured on a steering split (metric {' | '.join(STEERING_METRICS)}, split "
                f"{' | '.join(STEERING_SPLITS)})"
            )
        if objective.direction != "maximize":
            raise ValueError(f"{what} is minimised: a steering error is one minus a score to maximise")
        if objective.reduce != "min":
            notes.append(
                f"{', '.join(readers)}: raises the worst task, as a min objective asks; "
                f"this objective is a {objective.reduce}"
            )
    winner, path = arms(sweep, full, trials)[1], full["path"]
    steered = list(winner.values[path])
    if set(steered) != set(objective.tasks):
        notes.append(f"the steered tasks are {', '.join(steered)}; the objective scores {', '.join(objective.tasks)}")
    chosen = steered_arms(winner, path, methods, objective)
    seeds, data_seed = fresh_seeds(sweep, trials, k)
    trained = [winner, *chosen, start_arm(winner, path)]
    runs = [(arm.name, s, arm_experiment(sweep, arm, s, data_seed)) for arm in trained for s in seeds]
    return SteeringPlan(chosen, runs, seeds, data_seed, notes)


def verify_steering(
    sweep: Sweep,
    sweep_dir: Path,
    full: dict[str, Any],
    plan: SteeringPlan,
    trials: list[dict[str, Any]],
    launcher: Launcher | None = None,
    echo: Callable[[str], None] = print,
) -> dict[str, Any] | None:
    """Train ``plan``'s runs (finished runs reused; the winner's runs are the verification's), compare each steered
    arm with the winner and with its fixed start and write ``steer.json``; None when the runs were left going."""
    chosen, seeds, notes = plan.steered, plan.seeds, list(plan.notes)
    done, how = run_arms(sweep, sweep_dir, plan.runs, launcher, echo)
    if not done:
        return None
    objective = sweep.objectives[0]
    notes += own_seed_notes(sweep)
    names = list(dict.fromkeys(name for name, _, _ in plan.runs))  # the winner, the steered arms, the start
    scores = {name: arm_scores(objective, sweep_dir, name, seeds, notes) for name in names}
    crossed = itemised(list(scores.values()))
    adjusted = 1.0 - (1.0 - CONFIDENCE) / (2 * len(chosen))  # each method against the winner and its own start
    sign = 1.0 if objective.direction == "maximize" else -1.0
    rows = []
    for arm in chosen:
        row = {
            "arm": arm.name,
            "mixture": arm.values[full["path"]],
            "values": scores[arm.name].values,
            "mean": float(np.mean(scores[arm.name].values)),
        }
        for key, other in (("winner", "winner"), ("start", START_ARM)):
            diff = paired_difference(scores[arm.name], scores[other], crossed)
            wide = paired_difference(scores[arm.name], scores[other], crossed, adjusted)
            row[f"vs_{key}"] = {
                "estimate": diff[0],
                "low": diff[1],
                "high": diff[2],
                "adjusted": {"low": wide[1], "high": wide[2]},
                "verdict": _verdict(sign * wide[1], sign * wide[2], len(seeds)),
            }
        rows.append(row)
    report = {
        "sweep_dir": str(sweep_dir),
        "objective": objective.describe(),
        "direction": objective.direction,
        "seeds": seeds,
        "data_seed": plan.data_seed,
        "interval": interval_kind(crossed, len(seeds)),
        "family": f"Bonferroni over {2 * len(chosen)} comparisons (each steered arm with the sweep's winner and with "
        f"its start held fixed): two-sided level {adjusted:.4f}",
        "cost": f"each steered arm is one run; the sweep was {len(trials)} trials",
        "winner": winner_summary(full, scores["winner"]),
        "start": {"values": scores[START_ARM].values, "mean": float(np.mean(scores[START_ARM].values))},
        "rows": rows,
        "runs": {name: run_records(sweep_dir, name, seeds, how) for name in scores},
        "notes": notes,
    }
    atomic_write_text(Path(sweep_dir) / STEER_NAME, json.dumps(json_safe(report), indent=2) + "\n")
    return report


def _verdict(low: float, high: float, n_seeds: int) -> str | None:
    """From the adjusted interval of (steered − winner), signed so that positive is better: better, worse or
    not distinguished; None with one seed (no interval)."""
    if n_seeds < 2:
        return None
    lo, hi = sorted((low, high))
    return "better" if lo > 0 else "worse" if hi < 0 else "not distinguished"


def format_steering(report: dict[str, Any]) -> str:
    """The steered arms against the sweep's winner and against their start held fixed, on the fresh seeds."""
    w, start = report["winner"], report["start"]
    lines = [
        f"steering on fresh seeds {', '.join(map(str, report['seeds']))}: {report['objective']}",
        f"sweep's winner (trial {w['trial']}): in-sample {w['in_sample']:.4f}, fresh seeds {w['mean']:.4f}; "
        f"the uniform start held fixed: fresh seeds {start['mean']:.4f}",
        f"{'arm':<20} {'fresh mean':>10} {'against':<8} {'diff':>8}  95 % interval       adjusted",
    ]
    for r in report["rows"]:
        for i, key in enumerate(("winner", "start")):
            d = r[f"vs_{key}"]
            ci, wide = format_ci(d["low"], d["high"]), format_ci(d["adjusted"]["low"], d["adjusted"]["high"])
            verdict = f"  {d['verdict']}" if d["verdict"] else ""
            head = f"{r['arm']:<20} {r['mean']:>10.4f}" if i == 0 else " " * 31
            lines.append(f"{head} {key:<8} {d['estimate']:>+8.4f}  {ci} {wide}{verdict}")
    lines.append(f"intervals: {report['interval']}; {report['family']}; {report['cost']}")
    lines += [f"note: {n}" for n in report.get("notes", [])]
    return "\n".join(lines)
