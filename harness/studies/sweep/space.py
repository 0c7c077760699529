"""The loaded sweep and its search space: :class:`Param` (a space entry with its path resolved), :class:`Objective`,
:class:`Sweep` (which applies sampled values to the base experiment), and the sampling itself (simplex weights,
fraction counts, the seed trials enqueued first)."""

from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config import Experiment, TaskSpec, set_path
from harness.core.redact import mask_url, storage_url_from_env
from harness.studies.sweep.spec import BASE_EXPERIMENT_NAME, JOURNAL_NAME, SweepSpec


@dataclass
class Param:
    """One entry of the space, with its path resolved against the experiment."""

    path: str  # as written in the sweep file (the name of the optuna parameter and of the result columns)
    parts: list[Any]  # resolved (stage names → indices)
    kind: str
    spec: Any

    def optuna_names(self) -> list[str]:
        """The optuna parameters behind this entry: one per task for a simplex (its ``u``), else the path."""
        if self.kind == "simplex":
            return [f"{self.path}.{t}:u" for t in self.spec.simplex]
        return [self.path]

    def apply(self, raw: dict[str, Any], value: Any) -> None:
        """Set ``value`` (simplex: ``{task: w}``; fraction: k, set as its count of the pool) in the experiment
        mapping ``raw``; raises :class:`~harness.config.PathError` where the path cannot be set."""
        if self.kind == "fraction":
            value = fraction_count(raw, self, value)
        elif self.kind == "simplex":
            value = dict(value)
        set_path(raw, self.parts, value)


@dataclass
class Objective:
    """An objective resolved against the experiment: a metric on a split, reduced over tasks, read at the end of a
    stage, and its direction."""

    metric: str
    split: str
    tasks: list[str]
    reduce: str
    weights: dict[str, float] | None
    stage: str
    stage_index: int
    direction: str

    def describe(self) -> str:
        """One line for reports: ``maximize min(greedy on heldout: a, b) at the end of stage s``."""
        what = f"{self.metric} on {self.split}"
        tasks = ", ".join(self.tasks)
        if self.reduce == "weighted":
            tasks = ", ".join(f"{t}×{self.weights.get(t, 0):g}" for t in self.tasks)
        return f"{self.direction} {self.reduce}({what}: {tasks}) at the end of stage {self.stage}"

    def value(self, table: dict[str, dict[str, dict[str, float]]]) -> float:
        """The objective from ``{split: {task: {metric: value}}}``; KeyError names what is missing."""
        values = []
        for task in self.tasks:
            try:
                values.append(float(table[self.split][task][self.metric]))
            except KeyError:
                raise KeyError(f"no {self.metric}/{self.split}/{task} at the end of stage {self.stage}") from None
        if self.reduce == "min":
            return min(values)
        if self.reduce == "max":
            return max(values)
        if self.reduce == "weighted":
            w = [self.weights.get(t, 0.0) for t in self.tasks]
            return sum(a * b for a, b in zip(w, values)) / sum(w)
        return sum(values) / len(values)

    def to_yaml(self) -> dict[str, Any]:
        """The objective as written in ``sweep.resolved.yaml`` (every default filled in)."""
        out = {
            "metric": self.metric,
            "split": self.split,
            "tasks": list(self.tasks),
            "reduce": self.reduce,
            "stage": self.stage,
            "direction": self.direction,
        }
        if self.weights is not None:
            out["weights"] = dict(self.weights)
        return out


@dataclass
class Sweep:
    """A validated sweep: the spec, the base experiment (overrides applied) and the resolved space/objectives."""

    spec: SweepSpec
    source: str
    name: str
    base_raw: dict[str, Any]
    base: Experiment
    params: list[Param]
    objectives: list[Objective]
    notes: list[str] = field(default_factory=list)
    full_raw: dict[str, Any] | None = None  # a proxy sweep's base without its proxy (None: no proxy, or not kept)
    full_size: bool = False  # the base is the full-size one (harness.studies.sweep.load.at_full_size)

    @property
    def multi(self) -> bool:
        return len(self.objectives) > 1

    @property
    def first_swept_stage(self) -> int:
        """Index of the first stage a parameter can change (0 when one is global: lr in ``train``, pools, seed…):
        trials are identical before it, so the pruner only hears from evaluations from that stage on."""
        return min((p.parts[1] if p.parts[0] == "stages" and isinstance(p.parts[1], int) else 0) for p in self.params)

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.objectives]

    def storage_url(self, sweep_dir: Path) -> str:
        """The storage as a string: a URL, or the journal file's absolute path. ``$HARNESS_STORAGE`` gives the URL
        when ``study.storage`` is unset, or holds only its masked form (what ``sweep.resolved.yaml`` keeps)."""
        storage = self.spec.study.storage
        from_env = storage_url_from_env()
        if from_env and (not storage or storage == mask_url(from_env)):
            return from_env
        if storage and "://" in storage:
            return storage
        return str((Path(sweep_dir) / (storage or JOURNAL_NAME)).resolve())

    def fingerprint(self) -> str:
        """Identifies the search space and objectives: a study that exists with another one is refused."""
        data = {
            "space": {p.path: p.spec.model_dump(by_alias=True) for p in self.params},
            "objectives": [o.to_yaml() for o in self.objectives],
        }
        if self.spec.proxy:  # proxy and full-size trials never share a study (only when set: older keys unchanged)
            data["proxy"] = self.spec.proxy
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    # -- applying values ----------------------------------------------------------------------------------------

    def experiment_raw(self, values: dict[str, Any], trial_number: int | None = None) -> dict[str, Any]:
        """The base experiment with ``values`` ({param path: value; simplex → {task: w}; fraction → k}) applied,
        and the sweep's per-trial settings (no console, wandb group = study, checkpoints per ``checkpoints``)."""
        raw = copy.deepcopy(self.base_raw)
        given = [p for p in self.params if p.path in values]
        for p in sorted(given, key=lambda p: p.kind == "fraction"):  # fractions last, so a swept pool size counts
            p.apply(raw, values[p.path])
        tracking = raw.setdefault("tracking", {})
        tracking["console"] = False
        wandb = tracking.setdefault("wandb", {})
        wandb["group"] = self.name
        if trial_number is not None:
            wandb["tags"] = list(wandb.get("tags") or []) + [f"sweep:{self.name}", f"trial:{trial_number}"]
        if not self.spec.checkpoints:
            raw.setdefault("train", {})["checkpoint"] = False
            for stage in raw.get("stages", []):
                stage["checkpoint"] = False
        return raw

    def resolved_yaml(self) -> dict[str, Any]:
        """The sweep as workers read it: ``experiment`` is the copy written next to it, overrides applied."""
        study = self.spec.study.model_dump(mode="json")
        study["name"] = self.name
        if study.get("storage"):
            study["storage"] = mask_url(study["storage"])  # workers get the password through $HARNESS_STORAGE
        out: dict[str, Any] = {"experiment": BASE_EXPERIMENT_NAME}
        if self.spec.proxy:  # already applied to the experiment's copy (again when read back: the same values)
            out["proxy"] = self.spec.proxy
        out |= {
            "study": study,
            "space": {
                p.path: p.spec.model_dump(mode="json", by_alias=True, exclude_defaults=True) for p in self.params
            },
        }
        if self.multi:
            out["objectives"] = [o.to_yaml() for o in self.objectives]
        else:
            out["objective"] = self.objectives[0].to_yaml()
        out["seed_trials"] = self.spec.seed_trials
        out["checkpoints"] = self.spec.checkpoints
        return out


def fraction_count(raw: dict[str, Any], p: Param, k: float) -> int:
    """``round(k × pool)``: the examples a fraction ``k`` of the task's training pool (as ``raw`` sets it) gives."""
    task = p.spec.of or str(p.parts[-1])
    pool = (raw.get("tasks", {}).get(task) or {}).get("train", TaskSpec.model_fields["train"].default)
    return int(round(k * pool))


def simplex_weights(us: list[float]) -> list[float]:
    """Independent exponentials, normalised (optuna's FAQ for proportions); uniform when every u is 1."""
    xs = [-math.log(min(max(u, 1e-300), 1.0)) for u in us]
    total = sum(xs)
    if total <= 0 or not math.isfinite(total):
        return [1.0 / len(us)] * len(us)
    return [x / total for x in xs]


def sample_values(trial, sweep: Sweep) -> dict[str, Any]:
    """Suggest every parameter of the space for an optuna ``trial``; simplex weights become user attributes."""
    values: dict[str, Any] = {}
    for p in sweep.params:
        s = p.spec
        if p.kind == "simplex":
            us = [trial.suggest_float(name, 0.0, 1.0) for name in p.optuna_names()]
            weights = dict(zip(s.simplex, simplex_weights(us)))
            for task, w in weights.items():
                trial.set_user_attr(f"{p.path}.{task}", w)
            values[p.path] = weights
        elif p.kind == "float":
            values[p.path] = trial.suggest_float(p.path, *s.range, log=s.log, step=s.step)
        elif p.kind == "int":
            values[p.path] = trial.suggest_int(p.path, *s.range, log=s.log, step=s.step)
        elif p.kind == "choice":
            values[p.path] = trial.suggest_categorical(p.path, s.choices)
        else:  # fraction
            values[p.path] = trial.suggest_float(p.path, *s.range, log=s.log)
    return values


def seed_trial_params(sweep: Sweep) -> list[tuple[str, dict[str, float]]]:
    """The trials enqueued first when the space has simplexes: uniform weights, and the natural distribution
    (weights ∝ the tasks' training pool sizes), as optuna parameters (the ``u`` of each task)."""
    simplexes = [p for p in sweep.params if p.kind == "simplex"]
    if not simplexes or not sweep.spec.seed_trials:
        return []
    uniform, natural = {}, {}
    for p in simplexes:
        pools = [sweep.base.tasks[t].train for t in p.spec.simplex]
        for name, n in zip(p.optuna_names(), pools):
            uniform[name] = math.exp(-1.0)
            natural[name] = math.exp(-n / max(pools))
    out = [("uniform", uniform)]
    if natural != uniform:
        out.append(("natural", natural))
    return out
