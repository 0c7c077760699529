"""Loading an experiment: read the YAML, apply ``--set`` overrides, and validate in two passes, each collecting
*every* error before reporting:

1. the schema (types, ranges, unknown keys) — pydantic, :mod:`harness.config.schema`;
   then the plug-in modules the file names under ``plugins:`` are imported (:func:`import_experiment_plugins`; an
   entry that fails to import is an error at ``plugins[i]``, reported before the names it would have registered);
2. the meaning (mixtures name known tasks, ``init`` points at an earlier stage, recipe params, builtin models,
   evaluators and probes exist…), which needs the whole file and the registries.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from data_recipes import get_recipe
from harness.config.errors import ConfigError, yaml_errors
from harness.config.mixture import parse_mixture
from harness.config.paths import PathError, parse_path, resolve_path, set_path
from harness.config.schema import Experiment
from harness.config.yaml_io import load_raw, safe_load
from harness.core.plugins import import_plugins, resolve_entry
from harness.core.registry import EVALUATORS, MODEL_CHECKS, PROBES, PluginError, UnknownNameError, suggest

Errors = list[tuple[str, str]]


def _recipe_errors(exp: Experiment) -> Errors:
    """Every task names a registered recipe, and its params are that recipe's."""
    errors: Errors = []
    for name, task in exp.tasks.items():
        try:
            recipe = get_recipe(task.recipe)
        except UnknownNameError as e:
            errors.append((f"tasks.{name}.recipe", str(e)))
            continue
        try:
            recipe.Params.model_validate(task.params)
        except ValidationError as e:
            errors += [(f"tasks.{name}.params" + ("." + p if p else ""), m) for p, m in yaml_errors(e, recipe.Params)]
    return errors


def _model_errors(exp: Experiment) -> Errors:
    """The ``model`` section's checks that need the model layer (registered in :data:`MODEL_CHECKS`)."""
    return [error for name in MODEL_CHECKS.names() for error in MODEL_CHECKS.get(name)(exp.model)]


def _component_errors(exp: Experiment) -> Errors:
    """Evaluators and probes are registered; loss task weights name tasks of the experiment."""
    errors: Errors = []
    for field, registry in (("evaluators", EVALUATORS), ("probes", PROBES)):
        for i, name in enumerate(getattr(exp.eval, field)):
            if name not in registry:
                errors.append((f"eval.{field}[{i}]", str(UnknownNameError(registry.kind, name, registry.names()))))

    errors += _reference_errors(exp)

    task_names = list(exp.tasks)
    loss_specs = [("train.loss", exp.train.loss)] + [
        (f"stages[{i}].loss", stage.loss) for i, stage in enumerate(exp.stages) if stage.loss is not None
    ]
    for where, loss in loss_specs:
        for name in loss.task_weights or {}:
            if name not in task_names:
                errors.append((f"{where}.task_weights.{name}", f"unknown task {name!r}{suggest(name, task_names)}"))
    return errors


def _reference_errors(exp: Experiment) -> Errors:
    """The ``forgetting`` probe's reference text (harness.evaluation.forgetting): a file that exists and holds a
    document (a non-blank line); without one, a builtin base (an HF base has no builtin corpus to sample)."""
    if "forgetting" not in exp.eval.probes:
        return []
    path = exp.eval.reference_text
    if path is None:
        if exp.model.builtin is None:
            where = f"eval.probes[{exp.eval.probes.index('forgetting')}]"
            return [(where, "the forgetting probe needs eval.reference_text with a model.hf base (no builtin corpus)")]
        return []
    if not Path(path).is_file():
        return [("eval.reference_text", f"no reference text file '{path}'")]
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return [("eval.reference_text", f"cannot read reference text file '{path}': {type(e).__name__}")]
    if not text.strip():
        return [("eval.reference_text", f"reference text file '{path}' has no documents (one per non-blank line)")]
    return []


def _stage_errors(exp: Experiment) -> Errors:  # noqa: C901 — one independent check per stage field, each with its own message
    """Stage names are unique, ``init`` names an earlier stage, mixtures parse and fit the task pools, ``steps``
    is given exactly when the mixture does not fix it (counts)."""
    errors: Errors = []
    task_names = list(exp.tasks)
    seen: list[str] = []
    for i, stage in enumerate(exp.stages):
        path = f"stages[{i}]"
        if stage.name in seen:
            errors.append((f"{path}.name", f"duplicate stage name {stage.name!r}"))
        if stage.init not in ("previous", "base") and stage.init not in seen:
            later = [s.name for s in exp.stages[i:]]
            if stage.init in later:
                errors.append(
                    (
                        f"{path}.init",
                        f"stage {stage.init!r} does not come before {stage.name!r}; init can "
                        "only name an earlier stage",
                    )
                )
            else:
                errors.append(
                    (
                        f"{path}.init",
                        f"unknown stage {stage.init!r}"
                        f"{suggest(stage.init, seen + ['previous', 'base'])}; use previous, "
                        f"base or an earlier stage ({', '.join(seen) or 'none yet'})",
                    )
                )
        seen.append(stage.name)

        mixture = parse_mixture(stage.mixture, f"{path}.mixture", task_names, errors)
        if mixture is None:
            continue
        if mixture.kind == "counts":
            if stage.steps is not None:
                errors.append((f"{path}.steps", "steps is derived from counts (Σ counts / batch_size); remove it"))
            if not mixture.replace:
                for task, n in mixture.counts.items():
                    if n > exp.tasks[task].train:
                        errors.append(
                            (
                                f"{path}.mixture.counts.{task}",
                                f"{n} examples without replacement, but the pool has {exp.tasks[task].train}; "
                                "lower the count, raise tasks."
                                f"{task}.train, or set replace: true",
                            )
                        )
        elif stage.steps is None:
            errors.append((f"{path}.steps", "required field is missing"))
        if mixture.kind == "adaptive":
            every = mixture.adaptive.every
            if isinstance(every, int) and stage.steps is not None and every > stage.steps:
                errors.append(
                    (
                        f"{path}.mixture.adaptive.every",
                        f"every {every} > the stage's {stage.steps} steps: the controller would never update",
                    )
                )
            own = stage.model_dump(exclude_unset=True).get("length_grouping")
            if (own or exp.train.length_grouping) > 1:
                errors.append(
                    (
                        f"{path}.length_grouping" if own else "train.length_grouping",
                        f"length grouping needs the stage's future batches; stage {stage.name!r} draws its "
                        "batches as it trains (adaptive mixture): set length_grouping: 1 for it",
                    )
                )
        for task in mixture.tasks:
            if exp.tasks[task].train == 0:
                errors.append((f"{path}.mixture", f"task {task!r} has an empty training pool (tasks.{task}.train: 0)"))
    return errors


def _parallel_errors(exp: Experiment) -> Errors:
    """FSDP shards the training forward of a text model; an image-text model's loss calls its parts outside it."""
    if not (exp.model.builtin == "llava-tiny" or exp.model.vision):
        return []
    paths = []
    for i, stage in enumerate(exp.stages):
        own = stage.model_dump(exclude_unset=True).get("parallel")
        if (own or exp.train.parallel) == "fsdp":
            paths.append(f"stages[{i}].parallel" if own else "train.parallel")
    return [(path, "fsdp does not support image-text models yet; use ddp") for path in dict.fromkeys(paths)]


def lm_eval_installed() -> bool:
    """Whether lm-evaluation-harness can be imported (the ``benchmarks`` extra); found without importing it."""
    return importlib.util.find_spec("lm_eval") is not None


def _benchmark_errors(exp: Experiment) -> Errors:
    """``eval.benchmarks``: lm-eval is installed, include paths are directories, a step cadence falls on
    evaluations, no task twice, and no FSDP (lm-eval runs the whole model on rank 0). Task names are checked
    against lm-eval's task index at the run's start (indexing it takes seconds)."""
    specs = exp.eval.benchmarks or []
    if not specs:
        return []
    if not lm_eval_installed():
        return [
            (
                "eval.benchmarks",
                "needs lm-evaluation-harness (lm-eval 0.4.x), which is not installed: pip install -e '.[benchmarks]'",
            )
        ]
    errors: Errors = []
    seen: list[str] = []
    for i, spec in enumerate(specs):
        path = f"eval.benchmarks[{i}]"
        if spec.task in seen:
            errors.append((f"{path}.task", f"benchmark {spec.task!r} is listed twice"))
        seen.append(spec.task)
        if spec.include_path is not None and not Path(spec.include_path).is_dir():
            errors.append((f"{path}.include_path", f"not a directory: {spec.include_path}"))
        if isinstance(spec.every, int) and spec.every % exp.eval.every:
            errors.append(
                (
                    f"{path}.every",
                    f"{spec.every} is not a multiple of eval.every ({exp.eval.every}): "
                    "benchmarks run at evaluations only",
                )
            )
    if exp.train.parallel == "fsdp" or any(
        s.model_dump(exclude_unset=True).get("parallel") == "fsdp" for s in exp.stages
    ):
        errors.append(("eval.benchmarks", "not with fsdp: lm-eval runs the whole model on rank 0; use ddp"))
    return errors


def semantic_errors(exp: Experiment) -> Errors:
    """The second pass: checks that need the whole file and the registries, in the file's order of sections."""
    return (
        _recipe_errors(exp)
        + _model_errors(exp)
        + _component_errors(exp)
        + _benchmark_errors(exp)
        + _stage_errors(exp)
        + _parallel_errors(exp)
    )


def apply_overrides(raw: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    """Apply ``key.path=value`` strings (paths as in :mod:`harness.config.paths`); values are parsed as YAML
    (``3``, ``1e-3``, ``[a, b]``, ``{x: 1}``). A bad item raises ValueError."""
    data = copy.deepcopy(raw)
    for item in overrides or []:
        if "=" not in item:
            raise ValueError(f"--set expects key.path=value, got {item!r}")
        key, text = item.split("=", 1)
        dotted = key.strip()
        parts = parse_path(dotted)
        if not parts:
            raise ValueError(f"empty --set path in {dotted!r}")
        try:
            set_path(data, resolve_path(data, parts), safe_load(text))
        except PathError as e:
            raise ValueError(f"--set {dotted}: {e}") from None
        except yaml.YAMLError as e:
            raise ValueError(
                f"--set {dotted}: the value {text!r} is not valid YAML "
                f"({getattr(e, 'problem', None) or e}); quote it or fix the brackets"
            ) from None
    return data


class PluginImportError(ConfigError):
    """A plug-in module (``plugins:`` or an installed entry point) that cannot be imported: a config error (exit 2)
    whose lines name ``plugins[i]``."""


def import_experiment_plugins(entries: Any, source: str, base_dir: Path | None = None) -> None:
    """Import the installed entry points' plug-in modules and then each module ``entries`` (the ``plugins:`` list)
    names; ``base_dir``: what relative ``.py`` paths are relative to (default the current directory). Raises
    :class:`PluginImportError`. Entries that are not a list of strings are left to the schema pass."""
    named = [e for e in entries if isinstance(e, str)] if isinstance(entries, list) else []
    try:
        errors = import_plugins(named, base_dir)
    except PluginError as e:  # an installed distribution's entry point
        raise PluginImportError(source, [("plugins", str(e))]) from None
    if errors:
        raise PluginImportError(source, [(f"plugins[{i}]", message) for i, message in errors])


def resolve_plugin_paths(raw: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """``raw`` with every ``.py`` entry of ``plugins:`` made absolute against ``base_dir`` (the experiment file's
    directory), so the resolved experiment re-loads from anywhere (a run directory, a sweep worker)."""
    entries = raw.get("plugins")
    if not isinstance(entries, list):
        return raw
    return {**raw, "plugins": [resolve_entry(e, base_dir) if isinstance(e, str) else e for e in entries]}


def validate_data(data: dict[str, Any], source: str = "<experiment>") -> Experiment:
    """Validate a raw mapping; raises :class:`ConfigError` with every error found. Its ``plugins:`` are imported
    between the schema pass and the names (relative ``.py`` paths: against the current directory, and kept absolute
    in the experiment, so a job that receives it imports the same files wherever it starts)."""
    if isinstance(data, dict):
        data = resolve_plugin_paths(data, Path.cwd())
    try:
        exp = Experiment.model_validate(data)
    except ValidationError as e:
        raise ConfigError(source, yaml_errors(e, Experiment)) from None
    import_experiment_plugins(exp.plugins, source)
    errors = semantic_errors(exp)
    if errors:
        raise ConfigError(source, errors)
    return exp


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> Experiment:
    """Load, override and validate an experiment file."""
    raw = load_raw(path)
    try:
        raw = apply_overrides(raw, overrides)
    except ValueError as e:
        raise ConfigError(str(path), [("", str(e))]) from None
    return validate_data(resolve_file_paths(raw, Path(path).resolve().parent, str(path)), str(path))


def resolve_file_paths(raw: dict[str, Any], base_dir: Path, source: str) -> dict[str, Any]:
    """``raw`` with every path an experiment file names relative to itself made absolute against ``base_dir`` (its
    directory): the ``plugins:`` files (imported on the way, since a plug-in recipe resolves its own data paths) and
    the data paths (:func:`resolve_data_paths`). The one rule for an experiment file, a sweep's base experiment and
    a reproduction's arm alike. Raises :class:`PluginImportError`."""
    raw = resolve_plugin_paths(raw, base_dir)
    import_experiment_plugins(raw.get("plugins", []), source)  # before the recipes resolve their data paths
    return resolve_data_paths(raw, base_dir)


def resolve_data_paths(raw: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """``raw`` with the file paths of file-reading recipes (jsonl, parquet, …) made absolute against ``base_dir``
    (the experiment file's directory), so a run does not depend on the directory it is started from. Tasks whose
    recipe is unknown or whose params are not a mapping are left for validation to report."""
    out = _benchmark_paths(raw, base_dir)
    reference = out.get("eval", {}).get("reference_text") if isinstance(out.get("eval"), dict) else None
    if isinstance(reference, str):  # the forgetting probe's reference text file
        out = {**out, "eval": {**out["eval"], "reference_text": str((base_dir / reference).resolve())}}
    tasks = out.get("tasks")
    if not isinstance(tasks, dict):
        return out
    out = copy.deepcopy(out)
    for task in out["tasks"].values():
        if not isinstance(task, dict) or not isinstance(task.get("params"), dict):
            continue
        try:
            recipe = get_recipe(str(task.get("recipe")))
        except UnknownNameError:
            continue
        if hasattr(recipe, "resolve_paths"):
            task["params"] = recipe.resolve_paths(task["params"], str(base_dir))
    return out


def _benchmark_paths(raw: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """``raw`` with every ``eval.benchmarks[].include_path`` made absolute against ``base_dir``."""
    specs = raw.get("eval", {}).get("benchmarks") if isinstance(raw.get("eval"), dict) else None
    if not isinstance(specs, list):
        return raw
    out = copy.deepcopy(raw)
    for spec in out["eval"]["benchmarks"]:
        if isinstance(spec, dict) and isinstance(spec.get("include_path"), str):
            spec["include_path"] = str((base_dir / spec["include_path"]).resolve())
    return out
