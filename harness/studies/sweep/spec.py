"""The sweep file's schema (pydantic; typos are errors): the search space kinds, the objective(s), the optuna study
settings (``sampler: sobol | dirichlet`` are the space-filling designs of :mod:`harness.studies.sweep.design`), and
the names of the files a sweep directory holds.

A sweep file names a base experiment, an optuna study (storage, sampler, pruner, trial budget), a search
``space`` of dotted paths into the experiment, and the objective(s) read from the per-task metrics at the end of
a stage::

    experiment: ../quickstart.yaml
    study: {name: yesno_vs_qa, sampler: tpe, pruner: hyperband, n_trials: 24, seed: 0}
    space:
      stages.assistant.mixture: {simplex: [yesno, assistant_qa, short_qa]}
      stages.assistant.optim.lr: {float: [3.0e-4, 3.0e-3], log: true}
    objective: {metric: greedy, split: heldout, tasks: [assistant_qa, yesno], reduce: min}
    launcher: {partition: gpu, time: "4:00:00", gpus_per_job: 1}   # optional: the workers as SLURM jobs

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

Paths use the ``--set`` syntax (:mod:`harness.config.paths`: ``stages[2].mixture`` or ``stages.2.mixture``); a stage
may also be named (``stages.assistant.mixture``).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from harness.config import Strict
from harness.core.names import check_safe_name
from harness.studies.launch.spec import LauncherSpec

RESOLVED_NAME = "sweep.resolved.yaml"  # the sweep as workers read it, in the sweep directory
BASE_EXPERIMENT_NAME = "experiment.yaml"  # the base experiment (overrides applied), next to it
FULL_EXPERIMENT_NAME = "experiment.full.yaml"  # a proxy sweep's base experiment without its proxy, next to it
STORAGE_ENV = "HARNESS_STORAGE"  # the storage URL when the sweep file names none: its password stays out of files
JOURNAL_NAME = "journal.log"  # the default optuna storage: a journal file in the sweep directory


class SimplexSpace(Strict):
    """Mixture weights over these tasks (non-negative, summing to 1)."""

    simplex: list[str] = Field(..., min_length=2, description="Tasks of the stage's mixture.")

    @model_validator(mode="after")
    def _unique(self) -> SimplexSpace:
        dupes = sorted({t for t in self.simplex if self.simplex.count(t) > 1})
        if dupes:
            raise ValueError(f"tasks listed twice: {', '.join(dupes)}")
        return self


def _check_range(lo: float, hi: float, log: bool) -> None:
    """A numeric range is increasing, and positive on a log scale."""
    if not lo < hi:
        raise ValueError(f"the range needs lo < hi, got [{lo}, {hi}]")
    if log and lo <= 0:
        raise ValueError("log: true needs lo > 0")


class FloatSpace(Strict):
    """``suggest_float(path, lo, hi, log=…, step=…)``."""

    range: tuple[float, float] = Field(..., alias="float", description="[lo, hi]")
    log: bool = False
    step: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _ok(self) -> FloatSpace:
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
    def _ok(self) -> IntSpace:
        _check_range(*self.range, self.log)
        if self.log and self.step != 1:
            raise ValueError("give either log or step, not both")
        return self


class ChoiceSpace(Strict):
    """``suggest_categorical(path, choices)``."""

    choices: list[bool | int | float | str | None] = Field(..., alias="choice", min_length=1)


class FractionSpace(Strict):
    """A fraction k of a task's training pool, applied as ``round(k × pool)`` at a ``counts`` mixture entry."""

    range: tuple[float, float] = Field(..., alias="fraction", description="[lo, hi] with 0 <= lo < hi")
    log: bool = False
    of: str | None = Field(
        None, description="The task whose pool the fraction is of (default: the path's last element)."
    )

    @model_validator(mode="after")
    def _ok(self) -> FractionSpace:
        _check_range(*self.range, self.log)
        if self.range[0] < 0:
            raise ValueError("a fraction is >= 0")
        return self


SPACE_KINDS = {
    "simplex": SimplexSpace,
    "float": FloatSpace,
    "int": IntSpace,
    "choice": ChoiceSpace,
    "fraction": FractionSpace,
}


def space_kind(value: Any) -> str | None:
    """The kind of a space entry: its one kind key (raw mapping) or its class (validated); None when ambiguous."""
    if isinstance(value, dict):
        kinds = [k for k in SPACE_KINDS if k in value]
        return kinds[0] if len(kinds) == 1 else None
    return next((k for k, cls in SPACE_KINDS.items() if isinstance(value, cls)), None)


SpaceSpec = Annotated[
    Union[tuple(Annotated[cls, Tag(kind)] for kind, cls in SPACE_KINDS.items())],  # type: ignore[misc]  # noqa: UP007
    Discriminator(
        space_kind,
        custom_error_type="space_kind",
        custom_error_message="give exactly one of simplex, float, int, choice, fraction "
        "(e.g. {float: [1.0e-4, 1.0e-2], log: true})",
    ),
]


class ObjectiveSpec(Strict):
    """A value read from the per-task metrics at the end of a stage, reduced over tasks."""

    metric: str = Field("greedy", description="greedy, mode_ok, tf_first, loss, ft_hijack, …")
    split: str = Field("heldout", description="An evaluation split of the experiment.")
    tasks: list[str] | None = Field(None, min_length=1, description="Tasks reduced over (default: every task).")
    reduce: Literal["mean", "min", "max", "weighted"] = "mean"
    weights: dict[str, float] | None = Field(None, description="Per-task weights for reduce: weighted.")
    stage: str | None = Field(None, description="Stage whose end is read (default: the last).")
    direction: Literal["maximize", "minimize"] | None = Field(
        None, description="Default: minimize for loss, ft_rank_*, ft_hijack; maximize otherwise."
    )

    @model_validator(mode="after")
    def _weights(self) -> ObjectiveSpec:
        if self.reduce == "weighted":
            if not self.weights:
                raise ValueError("reduce: weighted needs weights: {task: w}")
            if any(w < 0 or not math.isfinite(w) for w in self.weights.values()) or not any(self.weights.values()):
                raise ValueError("weights must be finite, >= 0 and not all zero")
        elif self.weights is not None:
            raise ValueError("weights apply to reduce: weighted only")
        return self


class HeartbeatSpec(Strict):
    """A running trial's heartbeat is written as it makes progress (a training step or an evaluation finished), at
    most every ``interval`` s; one silent for ``grace`` s (killed, crashed, or hung in a step) is failed. ``grace``
    must outlast the longest stretch without progress: loading the base model, one evaluation, one checkpoint."""

    interval: float = Field(15.0, gt=0, description="Seconds between heartbeat writes at most.")
    grace: float = Field(
        600.0,
        gt=0,
        description="Seconds without progress after which a running trial is failed "
        "(longer than loading the model, one evaluation, one checkpoint).",
    )

    @model_validator(mode="after")
    def _ok(self) -> HeartbeatSpec:
        if self.grace <= self.interval:
            raise ValueError("grace must be longer than interval")
        return self


class StudySpec(Strict):
    """The optuna study: its name and storage, sampler and pruner, trial budget and worker heartbeats."""

    name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Study name (default: the sweep file's stem); also the wandb group.",
    )
    storage: str | None = Field(
        None,
        description="An optuna storage URL (sqlite:///x.db, postgresql://…, mysql://…) or a journal file path "
        "relative to the sweep directory; default: $HARNESS_STORAGE if set, else <sweep dir>/journal.log. "
        "A URL with a password is refused here: put it in HARNESS_STORAGE.",
    )
    sampler: Literal["tpe", "random", "gp", "nsga2", "sobol", "dirichlet"] = Field(
        "tpe",
        description="tpe, random, gp, nsga2 (optuna's); sobol or dirichlet: a space-filling design for fitting "
        "mixing laws, the same point for trial k on every worker (harness.studies.sweep.design).",
    )
    sampler_args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the sampler.")
    pruner: Literal["none", "median", "hyperband"] = "none"
    pruner_args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the pruner.")
    n_trials: int = Field(20, ge=1, description="Global budget: trials started (any state) over every worker.")
    timeout: float | None = Field(None, gt=0, description="Seconds after which a worker starts no new trial.")
    seed: int = Field(0, description="Sampler seed; worker i uses seed + i (a continued sweep: fresh seeds).")
    heartbeat: HeartbeatSpec = Field(default_factory=HeartbeatSpec)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str | None) -> str | None:
        # the pattern lets "." and ".." through: runs/sweeps/<name> would be runs/sweeps itself, or runs/
        return name if name is None else check_safe_name(name, "study name")


def proxy_text(proxy: dict[str, Any]) -> str:
    """A sweep's ``proxy:`` as the commands say it: ``path=value, …``."""
    return ", ".join(f"{path}={value}" for path, value in proxy.items())


class SweepSpec(Strict):
    """An optuna sweep over an experiment."""

    experiment: str = Field(..., description="The base experiment file, relative to the sweep file.")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="--set style overrides of the experiment: {path: value}."
    )
    proxy: dict[str, Any] | None = Field(
        None,
        description="Overrides that make every trial a cheap stand-in of the experiment (fewer steps, fewer "
        "evaluations, a smaller model): {path: value}, applied after overrides. A law fitted on proxy trials is "
        "tested on full-size ones: the same file with --set proxy=null.",
    )
    study: StudySpec = Field(default_factory=StudySpec)
    space: dict[str, SpaceSpec] = Field(..., min_length=1)  # type: ignore[valid-type]
    objective: ObjectiveSpec | None = None
    objectives: list[ObjectiveSpec] | None = Field(None, min_length=1)
    seed_trials: bool = Field(True, description="Enqueue uniform and natural mixture weights as the first trials.")
    checkpoints: bool = Field(False, description="Save stage checkpoints in every trial (off: trials keep none).")
    launcher: LauncherSpec | None = Field(None, description="Where the workers run with --launcher slurm.")

    @model_validator(mode="after")
    def _one_objective(self) -> SweepSpec:
        if (self.objective is None) == (self.objectives is None):
            raise ValueError("give either objective: {…} or objectives: [{…}, …]")
        return self
