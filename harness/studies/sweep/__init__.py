"""Sweeps: optuna studies over an experiment's mixture weights, stage lengths, learning rates, ….

- :mod:`~harness.studies.sweep.spec`: the sweep file's schema (space kinds, objectives, study settings);
- :mod:`~harness.studies.sweep.space`: the loaded :class:`Sweep`, its parameters and objectives, sampling;
- :mod:`~harness.studies.sweep.load`: :func:`load_sweep` (every error named by its YAML path, as for experiments);
- :mod:`~harness.studies.sweep.study`: optuna storage, journal lock, sampler, pruner, :func:`prepare_study`;
- :mod:`~harness.studies.sweep.worker`: the worker processes (``python -m harness.studies.sweep.worker``) and their
  launcher;
- :mod:`~harness.studies.sweep.results`: ``trials.parquet`` and the ``harness sweep-status`` report.

The worker and results modules are not imported here: a worker starts as ``python -m harness.studies.sweep.worker``,
which must not find its module already imported by its package.
"""

from harness.studies.sweep.load import load_resolved, load_sweep
from harness.studies.sweep.space import (
    Objective,
    Param,
    Sweep,
    fraction_count,
    sample_values,
    seed_trial_params,
    simplex_weights,
)
from harness.studies.sweep.spec import BASE_EXPERIMENT_NAME, JOURNAL_NAME, RESOLVED_NAME, SweepSpec
from harness.studies.sweep.study import (
    journal_lock,
    make_pruner,
    make_sampler,
    make_storage,
    prepare_study,
    quiet_optuna,
)

__all__ = [
    "BASE_EXPERIMENT_NAME",
    "JOURNAL_NAME",
    "RESOLVED_NAME",
    "Objective",
    "Param",
    "Sweep",
    "SweepSpec",
    "fraction_count",
    "journal_lock",
    "load_resolved",
    "load_sweep",
    "make_pruner",
    "make_sampler",
    "make_storage",
    "prepare_study",
    "quiet_optuna",
    "sample_values",
    "seed_trial_params",
    "simplex_weights",
]
