"""The experiment file: a pydantic schema (typos are errors), loading with ``yaml.safe_load``, ``--set``
overrides, cross-field checks, and error messages that name the YAML path (``stages[1].mixture.yesno``).

- :mod:`~harness.config.schema`: the sections (``*Spec``), :class:`Experiment`, :class:`ResolvedStage`; a stage may
  override any field of ``train`` and :meth:`Experiment.resolved_stages` merges the two; its sections by theme in
  :mod:`~harness.config.model_specs` (world, model), :mod:`~harness.config.train_specs` (train) and
  :mod:`~harness.config.run_specs` (tracking, data, debug);
- :mod:`~harness.config.mixture`: the stage mixture forms (weights, natural, counts, adaptive);
- :mod:`~harness.config.paths`: the dotted-path syntax of ``--set`` and sweep spaces;
- :mod:`~harness.config.errors`: :class:`ConfigError` and pydantic errors as YAML paths;
- :mod:`~harness.config.yaml_io`: reading and writing YAML;
- :mod:`~harness.config.load`: overrides and the two validation passes (schema, then meaning), each collecting
  every error before reporting.
"""

from harness.config.errors import ConfigError, yaml_errors
from harness.config.load import (
    PluginImportError,
    apply_overrides,
    load_experiment,
    semantic_errors,
    validate_data,
)
from harness.config.mixture import AdaptiveSpec, Mixture, SteeringSplit, parse_mixture, update_interval
from harness.config.paths import PathError, format_path, parse_path, resolve_path, set_path
from harness.config.run_specs import DataSpec, DebugSpec, InjectSpec, TrackingSpec, WandbSpec, computing_debug
from harness.config.schema import (
    EVAL_SPLITS,
    EvalSpec,
    Experiment,
    LossSpec,
    ModelSpec,
    NonFiniteSpec,
    OptimSpec,
    PretrainSpec,
    ResolvedStage,
    StageSpec,
    TaskSpec,
    TokenizerSpec,
    TrainableSpec,
    TrainSpec,
    WorldSpec,
)
from harness.config.seeds import task_seed
from harness.config.strict import Strict
from harness.config.yaml_io import dump_yaml, load_raw, safe_load

__all__ = [
    "EVAL_SPLITS",
    "ConfigError",
    "DataSpec",
    "DebugSpec",
    "EvalSpec",
    "Experiment",
    "InjectSpec",
    "LossSpec",
    "AdaptiveSpec",
    "SteeringSplit",
    "update_interval",
    "Mixture",
    "ModelSpec",
    "NonFiniteSpec",
    "OptimSpec",
    "PathError",
    "PretrainSpec",
    "ResolvedStage",
    "StageSpec",
    "Strict",
    "TaskSpec",
    "TokenizerSpec",
    "TrackingSpec",
    "TrainSpec",
    "TrainableSpec",
    "WandbSpec",
    "WorldSpec",
    "apply_overrides",
    "computing_debug",
    "task_seed",
    "dump_yaml",
    "format_path",
    "load_experiment",
    "PluginImportError",
    "load_raw",
    "parse_mixture",
    "parse_path",
    "resolve_path",
    "safe_load",
    "semantic_errors",
    "set_path",
    "validate_data",
    "yaml_errors",
]
