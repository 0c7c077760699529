"""Sweep files: optuna studies over an experiment's mixture weights, stage lengths, learning rates, ….

A sweep file names a base experiment, an optuna study (storage, sampler, pruner, trial budget), a search
``space`` of dotted paths into the experiment, and the objective(s) read from the per-task metrics at the end of
a stage::

    experiment: ../quickstart.yaml
    study: {name: yesno_vs_qa, sampler: tpe, pruner: hyperband, n_trials: 24, seed: 0}
    space:
      stages.assistant.mixture: {simplex: [yesno, assistant_qa, short_qa]}
      stages.assistant.optim.lr: {float: [3.0e-4, 3.0e-3], log: true}
    objective: {metric: greedy, split: heldout, tasks: [assistant_qa, yesno], reduce: min}

This module holds the schema, loading and validation (every error names its YAML path, as for experiments), the
application of sampled values to the experiment, the objective and the optuna plumbing (storage, sampler,
pruner). Workers live in :mod:`harness.sweep_worker`, results (``trials.parquet``, status) in
:mod:`harness.sweep_results`.

Space kinds
-----------
- ``{simplex: [task, …]}`` at a stage's ``mixture``: the stage's mixture becomes ``{task: w}`` over exactly these
  tasks, with w on the simplex (non-negative, Σw = 1); tasks of the original mixture not listed are dropped
  (weight 0). Sampled as optuna's FAQ recommends for proportions: ``x_t = -log(u_t)`` with
  ``u_t = suggest_float("<path>.<task>:u", 0, 1)``, then ``w_t = x_t / Σx``. The normalised weights are trial user
  attributes ``<path>.<task>``.
- ``{float: [lo, hi], log: bool, step: q}``, ``{int: [lo, hi], log: bool, step: k}``, ``{choice: [v, …]}``:
  ``suggest_float`` / ``suggest_int`` / ``suggest_categorical`` under the path's name.
- ``{fraction: [lo, hi], log: bool, of: task}`` at ``stages.<s>.mixture.counts.<task>``: a fraction k of the task's
  training pool (``of`` defaults to the last path element); the stage gets ``round(k × pool)`` examples of it (the
  DMT recipe: keep a fraction of the specialised data in the second stage). The parameter is k.

Paths use the ``--set`` syntax (``stages[2].mixture`` or ``stages.2.mixture``); a stage may also be named
(``stages.assistant.mixture``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Discriminator, Field, Tag, ValidationError, model_validator

from harness.config import (
    ConfigError,
    Experiment,
    Strict,
    TaskSpec,
    apply_overrides,
    dump_yaml,
    format_path,
    load_raw,
    safe_load,
    validate_data,
)
from harness.registry import suggest
from harness.store import LOWER_IS_BETTER

RESOLVED_NAME = "sweep.resolved.yaml"
BASE_EXPERIMENT_NAME = "experiment.yaml"
JOURNAL_NAME = "journal.log"
FINGERPRINT_ATTR = "harness:sweep"


# ----------------------------------------------------------------------------------------------------------------
# Schema
# ----------------------------------------------------------------------------------------------------------------


class SimplexSpace(Strict):
    """Mixture weights over these tasks (non-negative, summing to 1)."""

    simplex: list[str] = Field(..., min_length=2, description="Tasks of the stage's mixture.")

    @model_validator(mode="after")
    def _unique(self) -> "SimplexSpace":
        dupes = sorted({t for t in self.simplex if self.simplex.count(t) > 1})
        if dupes:
            raise ValueError(f"tasks listed twice: {', '.join(dupes)}")
        return self


def _check_range(lo: float, hi: float, log: bool) -> None:
    if not lo < hi:
        raise ValueError(f"the range needs lo < hi, got [{lo}, {hi}]")
    if log and lo <= 0:
        raise ValueError("log: true needs lo > 0")


class FloatSpace(Strict):
    """``suggest_float(path, lo, hi, log=…, step=…)``."""

    range: tuple[float, float] = Field(..., alias="float", description="[lo, hi]")
    log: bool = False
    step: Optional[float] = Field(None, gt=0)

    @model_validator(mode="after")
    def _ok(self) -> "FloatSpace":
        _check_range(*self.range, self.log)
        if self.log and self.step is not None:
            raise ValueError("give either log or step, not both")
        return self


class IntSpace(Strict):
    """``suggest_int(path, lo, hi, log=…, step=…)``."""

    range: tuple[int, int] = Field(..., alias="int", description="[lo, hi]")
    log: bool = False
    step: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _ok(self) -> "IntSpace":
        _check_range(*self.range, self.log)
        if self.log and self.step != 1:
            raise ValueError("give either log or step, not both")
        return self


class ChoiceSpace(Strict):
    """``suggest_categorical(path, choices)``."""

    choices: list[Union[bool, int, float, str, None]] = Field(..., alias="choice", min_length=1)


class FractionSpace(Strict):
    """A fraction k of a task's training pool, applied as ``round(k × pool)`` at a ``counts`` mixture entry."""

    range: tuple[float, float] = Field(..., alias="fraction", description="[lo, hi] with 0 <= lo < hi")
    log: bool = False
    of: Optional[str] = Field(None, description="The task whose pool the fraction is of (default: the path's last "
                                                "element).")

    @model_validator(mode="after")
    def _ok(self) -> "FractionSpace":
        _check_range(*self.range, self.log)
        if self.range[0] < 0:
            raise ValueError("a fraction is >= 0")
        return self


SPACE_KINDS = {"simplex": SimplexSpace, "float": FloatSpace, "int": IntSpace, "choice": ChoiceSpace,
               "fraction": FractionSpace}


def _space_kind(value: Any) -> Optional[str]:
    if isinstance(value, dict):
        kinds = [k for k in SPACE_KINDS if k in value]
        return kinds[0] if len(kinds) == 1 else None
    return next((k for k, cls in SPACE_KINDS.items() if isinstance(value, cls)), None)


SpaceSpec = Annotated[
    Union[tuple(Annotated[cls, Tag(kind)] for kind, cls in SPACE_KINDS.items())],  # type: ignore[misc]
    Discriminator(_space_kind, custom_error_type="space_kind",
                  custom_error_message="give exactly one of simplex, float, int, choice, fraction "
                                       "(e.g. {float: [1.0e-4, 1.0e-2], log: true})"),
]


class ObjectiveSpec(Strict):
    """A value read from the per-task metrics at the end of a stage, reduced over tasks."""

    metric: str = Field("greedy", description="greedy, mode_ok, tf_first, loss, ft_hijack, …")
    split: str = Field("heldout", description="An evaluation split of the experiment.")
    tasks: Optional[list[str]] = Field(None, min_length=1, description="Tasks reduced over (default: every task).")
    reduce: Literal["mean", "min", "max", "weighted"] = "mean"
    weights: Optional[dict[str, float]] = Field(None, description="Per-task weights for reduce: weighted.")
    stage: Optional[str] = Field(None, description="Stage whose end is read (default: the last).")
    direction: Optional[Literal["maximize", "minimize"]] = Field(
        None, description="Default: minimize for loss, ft_rank_*, ft_hijack; maximize otherwise.")

    @model_validator(mode="after")
    def _weights(self) -> "ObjectiveSpec":
        if self.reduce == "weighted":
            if not self.weights:
                raise ValueError("reduce: weighted needs weights: {task: w}")
            if any(w < 0 or not math.isfinite(w) for w in self.weights.values()) or not any(self.weights.values()):
                raise ValueError("weights must be finite, >= 0 and not all zero")
        elif self.weights is not None:
            raise ValueError("weights apply to reduce: weighted only")
        return self


class HeartbeatSpec(Strict):
    """Workers mark their running trial alive every ``interval`` s; one silent for ``grace`` s is failed."""

    interval: float = Field(15.0, gt=0)
    grace: float = Field(120.0, gt=0)

    @model_validator(mode="after")
    def _ok(self) -> "HeartbeatSpec":
        if self.grace <= self.interval:
            raise ValueError("grace must be longer than interval")
        return self


class StudySpec(Strict):
    name: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9_.-]+$",
                                description="Study name (default: the sweep file's stem); also the wandb group.")
    storage: Optional[str] = Field(
        None, description="An optuna storage URL (sqlite:///x.db, postgresql://…, mysql://…) or a journal file path "
                          "relative to the sweep directory; default: <sweep dir>/journal.log.")
    sampler: Literal["tpe", "random", "gp", "nsga2"] = "tpe"
    sampler_args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the sampler.")
    pruner: Literal["none", "median", "hyperband"] = "none"
    pruner_args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the pruner.")
    n_trials: int = Field(20, ge=1, description="Global budget: trials started (any state) over every worker.")
    timeout: Optional[float] = Field(None, gt=0, description="Seconds after which a worker starts no new trial.")
    seed: int = Field(0, description="Sampler seed; worker i uses seed + i.")
    heartbeat: HeartbeatSpec = Field(default_factory=HeartbeatSpec)


class SweepSpec(Strict):
    """An optuna sweep over an experiment."""

    experiment: str = Field(..., description="The base experiment file, relative to the sweep file.")
    overrides: dict[str, Any] = Field(default_factory=dict,
                                      description="--set style overrides of the experiment: {path: value}.")
    study: StudySpec = Field(default_factory=StudySpec)
    space: dict[str, SpaceSpec] = Field(..., min_length=1)  # type: ignore[valid-type]
    objective: Optional[ObjectiveSpec] = None
    objectives: Optional[list[ObjectiveSpec]] = Field(None, min_length=1)
    seed_trials: bool = Field(True, description="Enqueue uniform and natural mixture weights as the first trials.")
    checkpoints: bool = Field(False, description="Save stage checkpoints in every trial (off: trials keep none).")

    @model_validator(mode="after")
    def _one_objective(self) -> "SweepSpec":
        if (self.objective is None) == (self.objectives is None):
            raise ValueError("give either objective: {…} or objectives: [{…}, …]")
        return self


# ----------------------------------------------------------------------------------------------------------------
# Paths into the experiment
# ----------------------------------------------------------------------------------------------------------------


class PathError(ValueError):
    pass


def parse_path(path: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.findall(r"[^.\[\]]+", path)]


def resolve_parts(raw: dict[str, Any], parts: list[Any]) -> list[Any]:
    """``parts`` with stage names replaced by their index (``stages.assistant`` → ``stages[2]``)."""
    out: list[Any] = []
    node: Any = raw
    for part in parts:
        if isinstance(node, list):
            if isinstance(part, str):
                names = [x.get("name") for x in node if isinstance(x, dict)]
                if part not in names:
                    raise PathError(f"no element named {part!r} at {format_path(out)}{suggest(part, names)}; "
                                    f"names: {', '.join(map(str, names))}")
                part = names.index(part)
            elif part >= len(node):
                raise PathError(f"index {part} out of range at {format_path(out)} ({len(node)} elements)")
            node = node[part]
        elif isinstance(node, dict):
            node = node.get(part)
        elif node is not None:
            raise PathError(f"{format_path(out)} is {node!r}, not a mapping")
        out.append(part)
    return out


def set_path(raw: dict[str, Any], parts: list[Any], value: Any) -> None:
    """Set ``parts`` (already resolved) in ``raw``, creating mappings on the way; never replaces a scalar."""
    node: Any = raw
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            node = node[part]
            continue
        if node.get(part) is None:
            node[part] = {}
        elif not isinstance(node[part], (dict, list)):
            raise PathError(f"{format_path(parts[:i + 1])} is {node[part]!r}, not a mapping")
        node = node[part]
    node[parts[-1]] = value


def _split_overrides(items: list[str] | None) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """``--set`` items for the sweep file; ``space.<path>=…`` and ``overrides.<path>=…`` keep ``<path>`` whole."""
    plain, keyed = [], {"space": {}, "overrides": {}}
    for item in items or []:
        key, sep, text = item.partition("=")
        head, dot, rest = key.strip().partition(".")
        if sep and dot and head in keyed:
            keyed[head][rest] = safe_load(text)
        else:
            plain.append(item)
    return plain, keyed


# ----------------------------------------------------------------------------------------------------------------
# The loaded sweep
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class Param:
    """One entry of the space, with its path resolved against the experiment."""

    path: str  # as written in the sweep file (the name of the optuna parameter and of the result columns)
    parts: list[Any]  # resolved (stage names → indices)
    kind: str
    spec: Any

    def optuna_names(self) -> list[str]:
        if self.kind == "simplex":
            return [f"{self.path}.{t}:u" for t in self.spec.simplex]
        return [self.path]


@dataclass
class Objective:
    metric: str
    split: str
    tasks: list[str]
    reduce: str
    weights: Optional[dict[str, float]]
    stage: str
    stage_index: int
    direction: str

    def describe(self) -> str:
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
        out = {"metric": self.metric, "split": self.split, "tasks": list(self.tasks), "reduce": self.reduce,
               "stage": self.stage, "direction": self.direction}
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

    @property
    def multi(self) -> bool:
        return len(self.objectives) > 1

    @property
    def first_swept_stage(self) -> int:
        """Index of the first stage a parameter can change (0 when one is global: lr in ``train``, pools, seed…):
        trials are identical before it, so the pruner only hears from evaluations from that stage on."""
        return min((p.parts[1] if p.parts[0] == "stages" and isinstance(p.parts[1], int) else 0)
                   for p in self.params)

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.objectives]

    def storage_url(self, sweep_dir: Path) -> str:
        """The storage as a string: a URL, or the journal file's absolute path."""
        storage = self.spec.study.storage
        if storage and "://" in storage:
            return storage
        return str((Path(sweep_dir) / (storage or JOURNAL_NAME)).resolve())

    def fingerprint(self) -> str:
        """Identifies the search space and objectives: a study that exists with another one is refused."""
        data = {"space": {p.path: p.spec.model_dump(by_alias=True) for p in self.params},
                "objectives": [o.to_yaml() for o in self.objectives]}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    # -- applying values ----------------------------------------------------------------------------------------

    def experiment_raw(self, values: dict[str, Any], trial_number: Optional[int] = None) -> dict[str, Any]:
        """The base experiment with ``values`` ({param path: value; simplex → {task: w}; fraction → k}) applied,
        and the sweep's per-trial settings (no console, wandb group = study, checkpoints per ``checkpoints``)."""
        raw = copy.deepcopy(self.base_raw)
        fractions = []
        for p in self.params:
            if p.path not in values:
                continue
            if p.kind == "fraction":
                fractions.append(p)
            elif p.kind == "simplex":
                set_path(raw, p.parts, dict(values[p.path]))
            else:
                set_path(raw, p.parts, values[p.path])
        for p in fractions:  # after the others, so a swept pool size counts
            set_path(raw, p.parts, fraction_count(raw, p, values[p.path]))
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
        out: dict[str, Any] = {"experiment": BASE_EXPERIMENT_NAME, "study": study,
                               "space": {p.path: p.spec.model_dump(mode="json", by_alias=True, exclude_defaults=True)
                                         for p in self.params}}
        if self.multi:
            out["objectives"] = [o.to_yaml() for o in self.objectives]
        else:
            out["objective"] = self.objectives[0].to_yaml()
        out["seed_trials"] = self.spec.seed_trials
        out["checkpoints"] = self.spec.checkpoints
        return out


def fraction_count(raw: dict[str, Any], p: Param, k: float) -> int:
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


# ----------------------------------------------------------------------------------------------------------------
# Loading and validation
# ----------------------------------------------------------------------------------------------------------------


def _metric_names(exp: Experiment) -> list[str]:
    from harness.evaluation import EVALUATORS, PROBES

    names: list[str] = []
    for registry, picked in ((EVALUATORS, exp.eval.evaluators), (PROBES, exp.eval.probes)):
        for n in picked:
            names += [m for m in getattr(registry.get(n), "metric_names", ()) if m != "ft_top1"]
    return names


def _dry_values(p: Param) -> list[Any]:
    s = p.spec
    if p.kind == "simplex":
        return [{t: 1.0 / len(s.simplex) for t in s.simplex}]
    if p.kind in ("float", "int", "fraction"):
        return list(s.range)
    return list(s.choices)


def _check_param(sweep: Sweep, p: Param, errors: list[tuple[str, str]]) -> None:
    where = f"space.{p.path}"
    tasks = list(sweep.base.tasks)
    parts = p.parts
    if p.kind == "simplex":
        if not (len(parts) in (3, 4) and parts[0] == "stages" and parts[2] == "mixture"
                and (len(parts) == 3 or parts[3] == "weights")):
            errors.append((where, "simplex applies to a stage's mixture: stages.<stage>.mixture"))
            return
        for i, task in enumerate(p.spec.simplex):
            if task not in tasks:
                errors.append((f"{where}.simplex[{i}]",
                               f"unknown task {task!r}{suggest(task, tasks)}; tasks: {', '.join(tasks)}"))
    if p.kind == "fraction":
        if not (len(parts) == 5 and parts[0] == "stages" and parts[2:4] == ["mixture", "counts"]):
            errors.append((where, "fraction applies to a counts mixture entry: stages.<stage>.mixture.counts.<task>"))
            return
        task = p.spec.of or str(parts[-1])
        if task not in tasks:
            errors.append((f"{where}.of" if p.spec.of else where,
                           f"unknown task {task!r}{suggest(task, tasks)}; tasks: {', '.join(tasks)}"))
    if any(e[0].startswith(where) for e in errors):
        return
    for value in _dry_values(p):
        raw = copy.deepcopy(sweep.base_raw)
        try:
            if p.kind == "fraction":
                set_path(raw, parts, fraction_count(raw, p, value))
            else:
                set_path(raw, parts, value)
            validate_data(raw, sweep.source)
        except PathError as e:
            errors.append((where, str(e)))
            return
        except ConfigError as e:
            shown = repr(value) if p.kind != "simplex" else "uniform weights"
            own = format_path(parts)
            for path, msg in e.errors:
                if path == own:
                    errors.append((where, msg if msg.startswith("unknown key") else f"with {shown}: {msg}"))
                else:
                    errors.append((where, f"with {shown}: {path or 'the experiment'}: {msg}"))
            return


def _resolve_objective(o: ObjectiveSpec, where: str, exp: Experiment, errors: list[tuple[str, str]]) -> Objective:
    tasks, stages = list(exp.tasks), [s.name for s in exp.stages]
    metrics = _metric_names(exp)
    if o.metric not in metrics:
        errors.append((f"{where}.metric", f"unknown metric {o.metric!r}{suggest(o.metric, metrics)}; the "
                                          f"experiment's evaluators give: {', '.join(sorted(set(metrics)))}"))
    if o.split not in exp.eval.splits:
        errors.append((f"{where}.split", f"split {o.split!r} is not evaluated{suggest(o.split, exp.eval.splits)}; "
                                         f"eval.splits: {', '.join(exp.eval.splits)}"))
    for i, task in enumerate(o.tasks or []):
        if task not in tasks:
            errors.append((f"{where}.tasks[{i}]", f"unknown task {task!r}{suggest(task, tasks)}"))
    chosen = o.tasks or tasks
    for task in o.weights or {}:
        if task not in chosen:
            errors.append((f"{where}.weights.{task}", f"{task!r} is not among the objective's tasks"))
    if o.stage is not None and o.stage not in stages:
        errors.append((f"{where}.stage", f"unknown stage {o.stage!r}{suggest(o.stage, stages)}; "
                                         f"stages: {', '.join(stages)}"))
    stage = o.stage if o.stage in stages else stages[-1]
    direction = o.direction or ("minimize" if o.metric in LOWER_IS_BETTER else "maximize")
    return Objective(o.metric, o.split, list(chosen), o.reduce, o.weights, stage, stages.index(stage), direction)


def load_sweep(path: str | Path, overrides: list[str] | None = None) -> Sweep:
    """Load and validate a sweep file (``--set`` items applied); raises :class:`ConfigError` listing every error.

    The base experiment is read relative to the sweep file, the sweep's ``overrides`` applied, and validated; every
    space path must lead into the experiment (stages by index or name) and every value the space can take must
    keep it valid; objectives must name evaluated metrics, splits, tasks and stages.
    """
    path = Path(path)
    source = str(path)
    raw = load_raw(path)
    plain, keyed = _split_overrides(overrides)
    try:
        raw = apply_overrides(raw, plain)
    except ValueError as e:
        raise ConfigError(source, [("", str(e))]) from None
    for section, items in keyed.items():
        if items:
            if not isinstance(raw.get(section), dict):
                raw[section] = {}
            raw[section].update(items)
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(source, _sweep_errors(e)) from None

    exp_path = (path.parent / spec.experiment)
    errors: list[tuple[str, str]] = []
    if not exp_path.is_file():
        raise ConfigError(source, [("experiment", f"experiment file not found: {exp_path}")])
    base_raw = load_raw(exp_path)
    for key, value in spec.overrides.items():
        try:
            set_path(base_raw, resolve_parts(base_raw, parse_path(key)), copy.deepcopy(value))
        except PathError as e:
            errors.append((f"overrides.{key}", str(e)))
    if errors:
        raise ConfigError(source, errors)
    try:
        base = validate_data(base_raw, f"{exp_path} (the experiment of {source}, overrides applied)")
    except ConfigError as e:
        raise ConfigError(e.source, e.errors) from None

    name = spec.study.name or re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem if path.name != RESOLVED_NAME
                                     else path.parent.name)
    params: list[Param] = []
    for key, value in spec.space.items():
        kind = _space_kind(value)
        try:
            parts = resolve_parts(base_raw, parse_path(key))
        except PathError as e:
            errors.append((f"space.{key}", str(e)))
            continue
        if not parts:
            errors.append((f"space.{key}", "empty path"))
            continue
        params.append(Param(key, parts, kind, value))
    seen: dict[str, str] = {}
    for p in params:
        norm = format_path(p.parts)
        for other_norm, other in seen.items():
            if norm == other_norm or norm.startswith(other_norm + ".") or other_norm.startswith(norm + "."):
                errors.append((f"space.{p.path}", f"overlaps space.{other} (both set {min(norm, other_norm)})"))
        seen[norm] = p.path

    objective_specs = [spec.objective] if spec.objective else spec.objectives
    where = ["objective"] if spec.objective else [f"objectives[{i}]" for i in range(len(objective_specs))]
    objectives = [_resolve_objective(o, w, base, errors) for o, w in zip(objective_specs, where)]
    sweep = Sweep(spec, source, name, base_raw, base, params, objectives)
    for p in params:
        if not any(e[0] == f"space.{p.path}" for e in errors):
            _check_param(sweep, p, errors)
    if errors:
        order = ["experiment", "overrides", "study", "space", "objective", "objectives"]
        errors.sort(key=lambda e: order.index(re.split(r"[.\[]", e[0])[0]) if re.split(r"[.\[]", e[0])[0] in order
                    else len(order))
        raise ConfigError(source, errors)
    if sweep.multi and spec.study.pruner != "none":
        sweep.notes.append(f"study.pruner: {spec.study.pruner} is turned off: optuna's pruners do not support "
                           "multi-objective studies, so every trial runs to the end")
    if sweep.multi and spec.study.sampler == "tpe":
        sweep.notes.append("study.sampler: tpe on several objectives; nsga2 is the usual choice for a Pareto front")
    for label, make in (("sampler", lambda: make_sampler(sweep, 0)), ("pruner", lambda: make_pruner(sweep))):
        try:
            make()
        except ImportError as e:
            errors.append((f"study.{label}", str(e)))
        except (TypeError, ValueError) as e:
            errors.append((f"study.{label}_args", f"{getattr(spec.study, label)}: {e}"))
    if errors:
        raise ConfigError(source, errors)
    return sweep


def _sweep_errors(exc: ValidationError) -> list[tuple[str, str]]:
    """pydantic errors as (YAML path, message), with near-miss suggestions for unknown keys."""
    out = []
    for e in exc.errors():
        loc = list(e["loc"])
        tag = None
        if len(loc) >= 3 and loc[0] == "space" and loc[2] in SPACE_KINDS:
            tag = loc.pop(2)  # the union's tag is not part of the YAML path
        where = format_path(loc)
        if e["type"] == "extra_forbidden":
            parent = _sweep_model_at(loc[:-1], tag)
            known = [f.alias or n for n, f in parent.model_fields.items()] if parent else []
            key = str(loc[-1])
            hint = suggest(key, known)
            out.append((where, f"unknown key {key!r}" + (hint or (f"; allowed: {', '.join(known)}" if known else ""))))
        elif e["type"] == "missing":
            out.append((where, "required field is missing"))
        elif e["type"] == "literal_error":
            choices = re.findall(r"'([^']*)'", str(e.get("ctx", {}).get("expected", "")))
            out.append((where, f"unknown value {e['input']!r}{suggest(str(e['input']), choices)}; use "
                               + ", ".join(choices)))
        else:
            message = e["msg"]
            out.append((where, message[len("Value error, "):] if message.startswith("Value error, ") else message))
    return out


def _sweep_model_at(loc: list[Any], tag: Optional[str]):
    """The sweep schema model at a YAML location (for key suggestions)."""
    if not loc:
        return SweepSpec
    if loc == ["study"]:
        return StudySpec
    if loc == ["study", "heartbeat"]:
        return HeartbeatSpec
    if loc == ["objective"] or (len(loc) == 2 and loc[0] == "objectives"):
        return ObjectiveSpec
    if len(loc) == 2 and loc[0] == "space" and tag:
        return SPACE_KINDS[tag]
    return None


# ----------------------------------------------------------------------------------------------------------------
# Optuna plumbing
# ----------------------------------------------------------------------------------------------------------------


class FlockJournalLock:
    """An ``fcntl.flock`` on ``<journal>.flock``, in the shape of optuna's journal file locks (``acquire`` /
    ``release``; optuna does not export their base class, and only calls these two methods)."""

    def __init__(self, path: str):
        self.path = path
        self._held = threading.local()  # a descriptor per thread: flock excludes between descriptors

    def acquire(self) -> bool:
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        self._held.fd = fd
        return True

    def release(self) -> None:
        import fcntl

        fd = getattr(self._held, "fd", None)
        if fd is None:
            raise RuntimeError(f"{self.path}: released without being held")
        self._held.fd = None
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def journal_lock(journal_path: str):
    """The lock that serialises appends to the journal file.

    optuna's default (a symlink lock) survives its holder: a worker killed while appending — a heartbeat is
    appended every second, so this is not rare — leaves the lock file behind and every other process waits its
    30 s grace period before breaking it, by which time the dead worker's heartbeat looks stale too. An ``flock``
    is released by the kernel when its holder dies, so on POSIX the study carries on at once. (flock is unreliable
    on some network file systems: a journal shared across machines should be an RDB storage anyway.)"""
    try:
        import fcntl  # noqa: F401
    except ImportError:  # pragma: no cover — not on POSIX
        from optuna.storages.journal import JournalFileSymlinkLock

        return JournalFileSymlinkLock(journal_path)
    return FlockJournalLock(journal_path + ".flock")


def make_storage(url: str):
    """An optuna storage: RDB for URLs (``sqlite:///…``, ``postgresql://…``, ``mysql://…``), else a journal file."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    if "://" in url:
        return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite")
                                          else None)
    Path(url).parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(JournalFileBackend(url, lock_obj=journal_lock(url)))


def make_sampler(sweep: Sweep, worker_index: int):
    import optuna

    s = sweep.spec.study
    seed = s.seed + worker_index
    args = dict(s.sampler_args)
    if s.sampler == "tpe":
        args.setdefault("constant_liar", True)  # parallel workers: running trials count as bad guesses
        return optuna.samplers.TPESampler(seed=seed, **args)
    if s.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed, **args)
    if s.sampler == "gp":
        import importlib.util

        if importlib.util.find_spec("scipy") is None:
            raise ImportError("the gp sampler needs scipy: pip install scipy")
        return optuna.samplers.GPSampler(seed=seed, **args)
    return optuna.samplers.NSGAIISampler(seed=seed, **args)


def _steps_are_swept(sweep: Sweep) -> bool:
    return any(p.kind == "fraction" or {"steps", "counts", "batch_size"} & {str(x) for x in p.parts}
               for p in sweep.params)


def make_pruner(sweep: Sweep):
    """The pruner; hyperband's resources are global steps (min: ``eval.every``, max: the experiment's total)."""
    import optuna

    s = sweep.spec.study
    if s.pruner == "none" or sweep.multi:
        return optuna.pruners.NopPruner()
    if s.pruner == "median":
        return optuna.pruners.MedianPruner(**s.pruner_args)
    args = dict(s.pruner_args)
    args.setdefault("min_resource", sweep.base.eval.every)
    if "max_resource" not in args:
        args["max_resource"] = "auto" if _steps_are_swept(sweep) else \
            sum(st.steps for st in sweep.base.resolved_stages())
    return optuna.pruners.HyperbandPruner(**args)


def quiet_optuna() -> None:
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def prepare_study(sweep: Sweep, sweep_dir: Path):
    """Write ``experiment.yaml`` and ``sweep.resolved.yaml`` into ``sweep_dir``, create (or load) the study and
    enqueue the seed trials when it is new; returns the study. A study that exists with a different space or
    objectives is refused (:class:`ConfigError`)."""
    import optuna

    from harness.store import atomic_write_text

    quiet_optuna()
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    url = sweep.storage_url(sweep_dir)
    storage = make_storage(url)
    study = optuna.create_study(study_name=sweep.name, storage=storage, directions=sweep.directions,
                                load_if_exists=True, sampler=make_sampler(sweep, 0), pruner=make_pruner(sweep))
    fingerprint = study.user_attrs.get(FINGERPRINT_ATTR)
    if fingerprint is None:
        study.set_user_attr(FINGERPRINT_ATTR, sweep.fingerprint())
        study.set_user_attr("harness:objectives", [o.to_yaml() for o in sweep.objectives])
        study.set_user_attr("harness:space", {p.path: p.spec.model_dump(mode="json", by_alias=True)
                                              for p in sweep.params})
    elif fingerprint != sweep.fingerprint():
        raise ConfigError(sweep.source, [("study.name", f"study {sweep.name!r} already exists in {url} with another "
                                                        "space or objectives; choose another study.name or --out")])
    if [d.name.lower() for d in study.directions] != sweep.directions:
        raise ConfigError(sweep.source, [("study.name", f"study {sweep.name!r} exists with other directions")])
    if not study.get_trials(deepcopy=False):
        for _, params in seed_trial_params(sweep):
            study.enqueue_trial(params, skip_if_exists=True)
    atomic_write_text(sweep_dir / BASE_EXPERIMENT_NAME, dump_yaml(sweep.base_raw))
    header = f"# resolved from {sweep.source}; workers read this file\n"
    resolved = sweep.resolved_yaml()
    if sweep.spec.study.storage and "://" not in sweep.spec.study.storage:
        resolved["study"]["storage"] = url
    atomic_write_text(sweep_dir / RESOLVED_NAME, header + dump_yaml(resolved))
    return study


def load_resolved(sweep_dir: Path) -> Sweep:
    """The sweep of a sweep directory (its ``sweep.resolved.yaml``)."""
    return load_sweep(Path(sweep_dir) / RESOLVED_NAME)


__all__ = ["Sweep", "SweepSpec", "Param", "Objective", "load_sweep", "load_resolved", "prepare_study",
           "sample_values", "simplex_weights", "seed_trial_params", "make_storage", "make_sampler", "make_pruner",
           "RESOLVED_NAME", "JOURNAL_NAME"]
