"""Verifying a proposed mixture on fresh seeds (``harness mixture SWEEP_DIR --verify K``): the sweep's base experiment
with the proposal's mixture, and with the in-sample winner's parameters, each trained on K seeds the sweep never used,
then compared on the same held-out items by the sweep's own objective.

- Fresh seeds: model seeds ``max(used) + 1000 + i`` for i < K, where *used* holds the base experiment's ``seed``,
  ``data_seed``, its world's and tasks' seeds and every value a swept ``…seed`` parameter took, and one fresh task-data
  seed, ``max(used) + 1000``, shared by every run: both arms of every seed train on the same task pools, drawn anew,
  and are scored on the same eval items (checked: task, index, prompt and gold item by item), as a seed group is
  (:mod:`harness.studies.replicates`), so the seeds × items interval applies. A task with its own ``seed:`` keeps it
  (noted in the report).
- The proposal arm keeps the winner's other swept parameters (a learning rate, a stage length) and replaces only the
  mixture the proposal is about, so the comparison is of mixtures alone.
- Runs go to ``<SWEEP_DIR>/verify/<proposal|winner>/seed-<s>/`` through a launcher (:mod:`harness.studies.launch`),
  arm by arm (every seed of one arm, then the next, as :func:`~harness.studies.repro.jobs.run_planned` orders runs
  that go side by side): a seed's later arms replay the stages before the swept one from the stage cache, and with
  ``--jobs`` at most K the runs started together are of different seeds; a finished run of the same experiment is
  reused, not retrained.
- The report: the objective of each arm per seed (from each run's ``summary.json``, as the sweep scored its trials),
  the paired difference proposal − winner per seed and overall, and the winner's optimism (its in-sample value minus
  its fresh-seed mean, signed so that positive means the sweep flattered it). Intervals are 95 %: across seeds ×
  items (two-way crossed variance components on the per-item outcomes of the objective's tasks, each task's column
  weighted as the objective weights it) when the objective is a mean or weighted mean of a proportion metric whose
  items reproduce the run's value; otherwise a Student-t interval over the seeds' values, and the report says which.
  None from one seed.

``verify.json`` in the sweep directory holds all of it (written atomically); :func:`format_verification` is the
table ``harness mixture`` prints.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.config import Experiment
from harness.config.load import validate_data
from harness.core.jsonl import json_safe
from harness.core.metrics import PROPORTION_METRICS
from harness.core.stats import CONFIDENCE, crossed_interval, seeds_items_interval, t_interval, wilson_interval
from harness.core.store import atomic_write_text
from harness.evaluation.components import LOSS_TARGETS
from harness.studies.launch import Launcher
from harness.studies.launch.local import LocalLauncher
from harness.studies.repro.jobs import PlannedRun, run_planned
from harness.studies.sweep.space import Objective, Sweep
from harness.studies.sweep.worker import cached_steps

VERIFY_NAME = "verify.json"
VERIFY_DIR = "verify"
ARMS = ("proposal", "winner")
FRESH_OFFSET = 1000  # far past every seed the sweep used: no chance of meeting one of its data draws


@dataclass(frozen=True)
class Arm:
    name: str
    values: dict[str, Any]  # {param path: value} applied to the sweep's base experiment


def used_seeds(sweep: Sweep, trials: list[dict[str, Any]]) -> set[int]:
    """Every seed the sweep's runs could have used: the base's seeds and the swept seed parameters' values."""
    base = sweep.base
    used = {int(base.seed), int(base.world.seed)}
    if base.data_seed is not None:
        used.add(int(base.data_seed))
    used |= {int(t.seed) for t in base.tasks.values() if getattr(t, "seed", None) is not None}
    used |= {int(s) for s in (getattr(base, "seeds", None) or [])}  # a seed group's replicates (run --seeds)
    for row in trials:
        for key, value in row.items():
            if key.startswith("param/") and key.endswith("seed") and isinstance(value, (int, float)):
                if not (isinstance(value, float) and math.isnan(value)):
                    used.add(int(value))
    return used


def fresh_seeds(sweep: Sweep, trials: list[dict[str, Any]], k: int) -> tuple[list[int], int]:
    """``k`` model seeds the sweep never used, ``max(used) + FRESH_OFFSET + i``, and the data seed they all share,
    ``max(used) + FRESH_OFFSET`` (a draw of the task data no trial trained or was scored on)."""
    start = max(used_seeds(sweep, trials)) + FRESH_OFFSET
    return [start + i for i in range(k)], start


def arms(sweep: Sweep, proposal: dict[str, Any], trials: list[dict[str, Any]]) -> list[Arm]:
    """The winner's swept values (read from its row of ``trials.parquet``) and the same with the proposal's
    mixture in place of the winner's."""
    number = proposal["winner"]["number"]
    row = next((r for r in trials if r.get("number") == number), None)
    if row is None:
        raise ValueError(f"the winner, trial {number}, is not in trials.parquet")
    winner: dict[str, Any] = {}
    for p in sweep.params:
        if p.kind == "simplex":
            winner[p.path] = {t: float(row[f"param/{p.path}.{t}"]) for t in p.spec.simplex}
        elif row.get(f"param/{p.path}") is not None:
            winner[p.path] = row[f"param/{p.path}"]
    if proposal["path"] not in winner:
        raise ValueError(f"the proposal's mixture {proposal['path']} is not a simplex of this sweep")
    mixture = {t: float(proposal["mixture"].get(t, 0.0)) for t in winner[proposal["path"]]}
    return [Arm("proposal", {**winner, proposal["path"]: mixture}), Arm("winner", winner)]


MIXTURE_TOLERANCE = 1e-9  # two arms with the same weights up to float rounding are one arm


def same_values(a: Arm, b: Arm) -> bool:
    """The same swept values, mixtures equal up to float rounding."""
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


def distinct_arms(chosen: list[Arm]) -> list[Arm]:
    """The proposal and the winner, or the winner alone when the proposal is its mixture (no law beat the mean, or
    the law's optimum is the winner's trial): one experiment is trained once."""
    proposal, winner = chosen
    return [winner] if same_values(proposal, winner) else chosen


def run_records(sweep_dir: Path, arm: str, seeds: list[int], how: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Where each seed's run of ``arm`` is, whether it was trained or reused, and how many of its steps were
    replayed from the stage cache (the stages before the swept one)."""
    records = {}
    for seed in seeds:
        out = run_dir(sweep_dir, arm, seed)
        records[str(seed)] = {"run_dir": str(out), "how": how[f"{arm} seed {seed}"], "cached_steps": cached_steps(out)}
    return records


def interval_kind(crossed: bool, n_seeds: int) -> str:
    """How the report's intervals were made: across seeds × items, Student-t over the seeds, or none."""
    if n_seeds < 2:
        return "none: one seed"
    return "seeds × items" if crossed else "t over seeds"


def arm_experiment(sweep: Sweep, arm: Arm, seed: int, data_seed: int) -> Experiment:
    """The sweep's base with the arm's values, on model seed ``seed`` and task-data seed ``data_seed``."""
    raw = sweep.experiment_raw(arm.values)
    raw.update(seed=seed, data_seed=data_seed, seeds=None)
    raw["name"] = f"{sweep.name}-verify-{arm.name}"
    return validate_data(raw, f"verify {arm.name} seed {seed}")


def run_dir(sweep_dir: Path, arm: str, seed: int) -> Path:
    return Path(sweep_dir) / VERIFY_DIR / arm / f"seed-{seed}"


def run_arms(
    sweep: Sweep,
    sweep_dir: Path,
    plan: list[tuple[str, int, Experiment]],
    launcher: Launcher | None = None,
    echo: Callable[[str], None] = print,
) -> tuple[bool, dict[str, str]]:
    """Run every (arm, seed) not already finished with the same experiment; returns (all ended, {name: how})."""
    from harness.runs.execution.rundir import LOCK_FILE
    from harness.runs.execution.runner import changed_sections  # torch and transformers: only when something runs

    how, todo = {}, []
    for arm, seed, exp in plan:
        out = run_dir(sweep_dir, arm, seed)
        name = f"{arm} seed {seed}"
        finished = (out / "summary.json").is_file() and (out / "config.resolved.yaml").is_file()
        if finished and not changed_sections(exp, out):
            echo(f"{name}: finished run reused ({out})")
            how[name] = "reused"
            continue
        used = out.is_dir() and any(p.name != LOCK_FILE for p in out.iterdir())
        echo(f"{name}: {'to run again' if used else 'to run'} → {out}")
        how[name] = "trained"
        todo.append(PlannedRun(arm, seed, exp, out.resolve(), used))
    done = run_planned(todo, launcher or LocalLauncher(1, echo), lambda run: echo(f"{run.name}: done"))
    return done, how


def _stage_samples(out: Path, stage: str) -> list[dict[str, Any]]:
    """The ``samples.jsonl`` records of the run's last evaluation in ``stage``."""
    path = out / "samples.jsonl"
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    mine = [r for r in records if r.get("stage") == stage]
    last = max((r.get("step", 0) for r in mine), default=None)
    return [r for r in mine if r.get("step", 0) == last]


def _stage_table(out: Path, stage: str) -> dict[str, Any]:
    summary = json.loads((out / "summary.json").read_text())
    return next((s.get("metrics") or {} for s in summary.get("stages", []) if s["name"] == stage), {})


def _task_weights(objective: Objective) -> dict[str, float]:
    if objective.reduce == "weighted":
        return {t: float(objective.weights.get(t, 0.0)) for t in objective.tasks}
    return {t: 1.0 for t in objective.tasks}


def item_columns(out: Path, objective: Objective) -> tuple[list[tuple[str, int, str]], np.ndarray] | None:
    """The run's per-item outcomes of the objective's tasks as (keys, weighted values): keys (task, index,
    prompt + gold) to check two runs scored the same items, values scaled so that their plain mean is the
    objective. None when the objective is not a (weighted) mean of a proportion or a loss target (``eval_loss``,
    ``gold_logprob``, whose samples carry per-item values too) or the items are missing."""
    itemised = objective.metric in PROPORTION_METRICS or objective.metric in LOSS_TARGETS
    if objective.reduce not in ("mean", "weighted") or not itemised:
        return None
    records = _stage_samples(out, objective.stage)
    weights = _task_weights(objective)
    total = sum(weights.values())
    keys, per_task = [], []
    for task in objective.tasks:
        mine = [r for r in records if r["task"] == task and r["split"] == objective.split]
        outcomes = [(r.get("outcomes") or {}).get(objective.metric) for r in mine]
        if not mine or any(o is None for o in outcomes):
            return None
        keys += [(task, int(r["index"]), f"{r.get('prompt')}\x00{r.get('gold')}") for r in mine]
        per_task.append((weights[task] / total, np.asarray(outcomes, dtype=float)))
    # item i of task t counts share_t · N / n_t: the plain mean of all N columns is then Σ_t share_t · mean_t
    n = len(keys)
    return keys, np.concatenate([share * n / len(o) * o for share, o in per_task])


def _is_binary(table: np.ndarray) -> bool:
    return bool(np.isin(table, (0.0, 1.0)).all())


def _proportion_interval(table: np.ndarray) -> tuple[float, float, float]:
    """One arm's mean: :func:`harness.core.stats.seeds_items_interval` for 0/1 items (never zero-width while items
    could vary), the crossed interval of weighted items otherwise."""
    if _is_binary(table) and table.shape[0] > 1:
        ci = seeds_items_interval(table.tolist())
        return ci.estimate, ci.low, ci.high
    return crossed_interval(table)


def _floored(a: np.ndarray, b: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """The crossed interval of the paired differences ``a − b``. When no item differs between the arms it would be
    zero-width; for 0/1 outcomes it is then ± the Wilson upper bound of the rate of discordant items (0 of
    seeds × items): the difference cannot exceed the discordance."""
    mean, low, high = crossed_interval(a - b, confidence)
    if a.shape[0] > 1 and low == high and _is_binary(a) and _is_binary(b):
        bound = wilson_interval(int(np.sum(a != b)), a.size, confidence).high
        return mean, mean - bound, mean + bound
    return mean, low, high


def _seed_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    ci = t_interval(values, confidence)
    return ci.estimate, ci.low, ci.high


@dataclass
class ArmScores:
    """One arm's objective on each seed and, when the objective is itemised, its seeds × items table (weighted
    outcomes whose row means are the seeds' values) and the items' keys."""

    values: list[float]
    table: np.ndarray | None
    keys: list[tuple[str, int, str]] | None


def arm_scores(objective: Objective, sweep_dir: Path, arm: str, seeds: list[int], notes: list[str]) -> ArmScores:
    """Read one arm's runs; raises ValueError when two of its seeds were scored on other items. A seed whose items
    do not reproduce its value leaves the arm without a table (noted): its items are not the objective's."""
    values, rows, keys, faithful = [], [], None, True
    for seed in seeds:
        out = run_dir(sweep_dir, arm, seed)
        value = objective.value(_stage_table(out, objective.stage))
        values.append(value)
        items = item_columns(out, objective)
        if items is None:
            continue
        if keys is not None and items[0] != keys:
            raise ValueError(f"{arm} seed {seed} was scored on other items than {arm} seed {seeds[0]}")
        keys = items[0]
        if abs(float(items[1].mean()) - value) > 1e-9:
            notes.append(f"{arm} seed {seed}: its items do not reproduce its {objective.metric} ({value:.6f})")
            faithful = False
        rows.append(items[1])
    table = np.vstack(rows) if faithful and len(rows) == len(seeds) and rows else None
    return ArmScores(values, table, keys)


def winner_summary(full: dict[str, Any], scores: ArmScores) -> dict[str, Any]:
    """The sweep's winner as the budget curve and the steering report show it: its trial, in-sample value and fresh
    values with their mean."""
    return {
        "trial": full["winner"]["number"],
        "values": scores.values,
        "mean": float(np.mean(scores.values)),
        "in_sample": full["winner"]["observed"],
    }


def itemised(scores: list[ArmScores]) -> bool:
    """Whether every arm has its items table and all were scored on the same ones (ValueError if not the same);
    from the scores alone, so verify, --budget and --steer, whatever their notes, give one comparison one interval."""
    keyed = [s.keys for s in scores if s.keys is not None]
    if any(keys != keyed[0] for keys in keyed):
        raise ValueError("the arms were scored on other items: their runs cannot be paired item by item")
    return all(s.table is not None for s in scores)


def paired_difference(
    a: ArmScores, b: ArmScores, crossed: bool, confidence: float = CONFIDENCE
) -> tuple[float, float, float]:
    """``a − b`` with its interval: crossed seeds × items when ``crossed``, else t over the seeds' differences."""
    if crossed:
        return _floored(a.table, b.table, confidence)
    return _seed_interval([x - y for x, y in zip(a.values, b.values)], confidence)


def compare(
    sweep: Sweep, sweep_dir: Path, seeds: list[int], proposal: dict[str, Any], same: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """The arms' objective per seed, their paired difference and the winner's optimism, with intervals (module
    docstring); raises ValueError when two runs of one seed were not scored on the same items. ``same``: the
    proposal is the winner's mixture, read from the winner's runs (difference 0 by construction)."""
    objective = sweep.objectives[0]
    notes: list[str] = []
    read = ["winner"] if same else list(ARMS)
    scores = {arm: arm_scores(objective, sweep_dir, arm, seeds, notes) for arm in read}
    scores = {"proposal": scores["winner"], **scores} if same else scores
    crossed = itemised(list(scores.values()))
    values = {arm: s.values for arm, s in scores.items()}
    sign = 1.0 if objective.direction == "maximize" else -1.0
    diff = (0.0, 0.0, 0.0) if same else paired_difference(scores["proposal"], scores["winner"], crossed)
    fresh = _proportion_interval(scores["winner"].table) if crossed else _seed_interval(values["winner"])
    keys = next((s.keys for s in scores.values() if s.keys is not None), None)  # the same in every arm (itemised)
    observed = float(proposal["winner"]["observed"])
    bounds = sorted(sign * (observed - b) for b in fresh[1:])
    report = {
        "objective": objective.describe(),
        "direction": objective.direction,
        "interval": interval_kind(crossed, len(seeds)),
        "n_seeds": len(seeds),
        "n_items": len(keys) if keys else None,
        "same_items": keys is not None,
        "per_seed": [
            {"seed": s, "proposal": a, "winner": b, "difference": a - b}
            for s, a, b in zip(seeds, values["proposal"], values["winner"])
        ],
        "proposal": {"mean": float(np.mean(values["proposal"]))},
        "winner": {"mean": fresh[0], "low": fresh[1], "high": fresh[2]},
        "difference": {"estimate": diff[0], "low": diff[1], "high": diff[2]},
        "in_sample": {
            "trial": proposal["winner"]["number"],
            "observed": observed,
            "predicted_gain": proposal.get("gain_over_winner"),
        },
        "optimism": {"estimate": sign * (observed - fresh[0]), "low": bounds[0], "high": bounds[1]},
    }
    return report, notes


def own_seed_notes(sweep: Sweep) -> list[str]:
    """A note when some tasks keep their own ``seed:``: their data is the sweep's, not a fresh draw."""
    own = sorted(t for t, spec in sweep.base.tasks.items() if getattr(spec, "seed", None) is not None)
    return [f"tasks {', '.join(own)} keep their own seed: their data is the sweep's, not fresh"] if own else []


def verify(
    sweep: Sweep,
    sweep_dir: Path,
    proposal: dict[str, Any],
    trials: list[dict[str, Any]],
    k: int,
    launcher: Launcher | None = None,
    echo: Callable[[str], None] = print,
) -> dict[str, Any] | None:
    """Train both arms on ``k`` fresh seeds (one arm when the proposal is the winner's mixture; finished runs
    reused), compare them and write ``verify.json``; returns its content, or None when the launcher left the runs
    going (detached)."""
    seeds, data_seed = fresh_seeds(sweep, trials, k)
    chosen = arms(sweep, proposal, trials)
    trained = distinct_arms(chosen)
    same = len(trained) < len(chosen)
    plan = [(arm.name, s, arm_experiment(sweep, arm, s, data_seed)) for arm in trained for s in seeds]
    done, how = run_arms(sweep, sweep_dir, plan, launcher, echo)
    if not done:
        return None
    report, notes = compare(sweep, sweep_dir, seeds, proposal, same)
    notes += own_seed_notes(sweep)
    if sweep.full_size:
        notes.append(
            "full size: the arms are the experiment without the sweep's proxy; the winner's in-sample value is its "
            "proxy trial's, so its optimism here is the proxy-to-full-size shift as much as the sweep's flattery"
        )
    if same:
        notes.append("the proposal is the winner's mixture: the winner's runs stand for both arms (difference 0)")
    report = {
        "sweep_dir": str(sweep_dir),
        "seeds": seeds,
        "data_seed": data_seed,
        "seed_rule": f"max(seeds the sweep used) + {FRESH_OFFSET} + i; data seed max + {FRESH_OFFSET} for all",
        "arms": {
            arm.name: {"values": arm.values, "runs": run_records(sweep_dir, "winner" if same else arm.name, seeds, how)}
            for arm in chosen
        },
        **report,
        "notes": notes,
    }
    atomic_write_text(Path(sweep_dir) / VERIFY_NAME, json.dumps(json_safe(report), indent=2) + "\n")
    return report


def format_ci(low: float | None, high: float | None) -> str:
    """``[low, high]`` with signs, or ``[no interval]`` where a bound is missing or not finite."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return "[no interval]"
    return f"[{low:+.4f}, {high:+.4f}]"


def format_verification(report: dict[str, Any]) -> str:
    """The table ``harness mixture --verify`` prints: per seed, each arm's objective and their difference; then
    the overall difference and the winner's optimism, with their intervals and how they were made."""
    lines = [
        f"verification on fresh seeds: {report['objective']}",
        f"seeds {', '.join(map(str, report['seeds']))} (data seed {report['data_seed']}); "
        f"items per run: {report['n_items'] if report['n_items'] else 'not itemised'}",
        f"{'seed':>8} {'proposal':>10} {'winner':>10} {'prop − win':>11}",
    ]
    for row in report["per_seed"]:
        lines.append(f"{row['seed']:>8} {row['proposal']:>10.4f} {row['winner']:>10.4f} {row['difference']:>+11.4f}")
    d, o, w = report["difference"], report["optimism"], report["in_sample"]
    lines += [
        f"{'mean':>8} {report['proposal']['mean']:>10.4f} {report['winner']['mean']:>10.4f} {d['estimate']:>+11.4f} "
        f"{format_ci(d['low'], d['high'])}  (95 %, {report['interval']}; n = {report['n_seeds']} seeds)",
        f"winner (trial {w['trial']}) in-sample {w['observed']:.4f}, on fresh seeds {report['winner']['mean']:.4f}: "
        f"optimism {o['estimate']:+.4f} {format_ci(o['low'], o['high'])} (positive: the sweep flattered it)",
    ]
    lines += [f"note: {n}" for n in report.get("notes", [])]
    return "\n".join(lines)
