"""Loading a sweep file: ``--set`` items, the schema (:mod:`harness.studies.sweep.spec`), the base experiment with the
sweep's overrides, the space paths resolved into the experiment, the objectives resolved against its evaluators,
splits, tasks and stages. Every error names its YAML path, as for experiments, and all are reported at once.
"""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.config import (
    ConfigError,
    Experiment,
    PathError,
    apply_overrides,
    format_path,
    load_raw,
    parse_path,
    resolve_path,
    safe_load,
    set_path,
    validate_data,
    yaml_errors,
)
from harness.config.load import resolve_file_paths
from harness.core.metrics import LOSS_POOL_METRICS, loss_pool_split
from harness.core.names import check_safe_name
from harness.core.registry import EVALUATORS, PROBES, suggest
from harness.core.store import LOWER_IS_BETTER
from harness.studies.sweep.space import Objective, Param, Sweep
from harness.studies.sweep.spec import FULL_EXPERIMENT_NAME, RESOLVED_NAME, ObjectiveSpec, SweepSpec, space_kind
from harness.studies.sweep.study import make_pruner, make_sampler

Errors = list[tuple[str, str]]
# errors come in this order
SECTION_ORDER = ["experiment", "overrides", "proxy", "study", "space", "objective", "objectives", "launcher"]


def _split_overrides(items: list[str] | None) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """``--set`` items for the sweep file; ``space.<path>=…``, ``overrides.<path>=…`` and ``proxy.<path>=…`` keep
    ``<path>`` whole."""
    plain, keyed = [], {"space": {}, "overrides": {}, "proxy": {}}
    for item in items or []:
        key, sep, text = item.partition("=")
        head, dot, rest = key.strip().partition(".")
        if sep and dot and head in keyed:
            keyed[head][rest] = safe_load(text)
        else:
            plain.append(item)
    return plain, keyed


def _read_spec(path: Path, overrides: list[str] | None) -> SweepSpec:
    """The sweep file with its ``--set`` items applied, validated by the schema."""
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
        return SweepSpec.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(source, yaml_errors(e, SweepSpec)) from None


def _full_raw(path: Path, spec: SweepSpec) -> dict[str, Any] | None:
    """A proxy sweep's base without its proxy, raw and not validated (:func:`at_full_size` does that when it is
    used; a proxy sweep whose base alone is not a valid experiment still runs its proxies): from the sweep file, or
    the copy a sweep directory keeps. None without a proxy, or a sweep directory that kept none."""
    if not spec.proxy:
        return None
    if path.name != RESOLVED_NAME:
        return _read_base(path, spec, proxied=False)[0]
    kept = path.parent / FULL_EXPERIMENT_NAME
    return load_raw(kept) if kept.is_file() else None


def at_full_size(sweep: Sweep) -> Sweep:
    """``sweep`` with its full-size base (the experiment without the sweep's ``proxy:``) in place of the proxy's:
    what its trials stand for. The base is validated, and the objectives and space checked against it, as a sweep
    file's own; raises :class:`ConfigError` on any error, or when there is no full-size base."""
    if sweep.full_raw is None:
        why = (
            "the sweep has no proxy: its trials are full size"
            if not sweep.spec.proxy
            else f"no {FULL_EXPERIMENT_NAME} in the sweep directory (made before the harness kept it)"
        )
        raise ConfigError(sweep.source, [("proxy", why)])
    source = f"{sweep.source} at full size (without its proxy)"
    base = validate_data(copy.deepcopy(sweep.full_raw), source)
    errors: Errors = []
    objectives = _resolve_objectives(sweep.spec, base, errors)
    full = replace(sweep, base_raw=copy.deepcopy(sweep.full_raw), base=base, objectives=objectives, full_size=True)
    for p in full.params:
        _check_param(full, p, errors)
    if errors:
        raise ConfigError(source, sorted(errors, key=_section))
    return full


def _read_base(path: Path, spec: SweepSpec, proxied: bool = True) -> tuple[dict[str, Any], Experiment | None]:
    """The base experiment (read relative to the sweep file) with the sweep's ``overrides`` and then its ``proxy``,
    raw and validated (unless not ``proxied``: then without the proxy, and not validated). Its ``plugins:`` files
    and data paths are made absolute against the experiment file's directory, as for a plain experiment, so every
    trial and verification run finds them wherever it starts."""
    source = str(path)
    exp_path = path.parent / spec.experiment
    if not exp_path.is_file():
        raise ConfigError(source, [("experiment", f"experiment file not found: {exp_path}")])
    base_raw = load_raw(exp_path)
    errors: Errors = []
    # A resolved sweep's experiment copy has the proxy applied already (its paths made absolute): not again.
    proxy = spec.proxy if path.name != RESOLVED_NAME and proxied else None
    for section, items in (("overrides", spec.overrides), ("proxy", proxy or {})):
        for key, value in items.items():
            try:
                set_path(base_raw, resolve_path(base_raw, parse_path(key)), copy.deepcopy(value))
            except PathError as e:
                errors.append((f"{section}.{key}", str(e)))
    if errors:
        raise ConfigError(source, errors)
    described = f"{exp_path} (the experiment of {source}, overrides{' and proxy' if proxy else ''} applied)"
    try:
        base_raw = resolve_file_paths(base_raw, exp_path.resolve().parent, described)
        base = validate_data(base_raw, described) if proxied else None
    except ConfigError as e:
        raise ConfigError(e.source, e.errors) from None
    return base_raw, base


def _resolve_params(spec: SweepSpec, base_raw: dict[str, Any], errors: Errors) -> list[Param]:
    """The space's entries with their paths resolved into the experiment; paths that overlap are errors."""
    params: list[Param] = []
    for key, value in spec.space.items():
        try:
            parts = resolve_path(base_raw, parse_path(key))
        except PathError as e:
            errors.append((f"space.{key}", str(e)))
            continue
        if not parts:
            errors.append((f"space.{key}", "empty path"))
            continue
        params.append(Param(key, parts, space_kind(value), value))
    seen: dict[str, str] = {}
    for p in params:
        norm = format_path(p.parts)
        for other_norm, other in seen.items():
            if norm == other_norm or norm.startswith(other_norm + ".") or other_norm.startswith(norm + "."):
                errors.append((f"space.{p.path}", f"overlaps space.{other} (both set {min(norm, other_norm)})"))
        seen[norm] = p.path
    return params


def _metric_names(exp: Experiment) -> list[str]:
    """The per-task metrics the experiment's evaluators and probes report (``ft_top1`` is a table, not a number)."""
    names: list[str] = []
    for registry, picked in ((EVALUATORS, exp.eval.evaluators), (PROBES, exp.eval.probes)):
        for n in picked:
            names += [m for m in getattr(registry.get(n), "metric_names", ()) if m != "ft_top1"]
    return names


def _loss_splits(exp: Experiment) -> list[str]:
    """The loss pool's splits (``loss_heldout``, …) when ``eval.loss_items`` asks for one."""
    held_out = [s for s in exp.eval.splits if s != "train"]
    return [loss_pool_split(s) for s in held_out] if exp.eval.loss_items else []


def _resolve_objective(o: ObjectiveSpec, where: str, exp: Experiment, errors: Errors) -> Objective:
    """The objective with its defaults filled in from the experiment; what it names must exist there."""
    tasks, stages = list(exp.tasks), [s.name for s in exp.stages]
    metrics = _metric_names(exp)
    if o.metric not in metrics:
        errors.append(
            (
                f"{where}.metric",
                f"unknown metric {o.metric!r}{suggest(o.metric, metrics)}; the "
                f"experiment's evaluators give: {', '.join(sorted(set(metrics)))}",
            )
        )
    splits = exp.eval.splits + _loss_splits(exp)
    if o.split not in splits:
        errors.append(
            (
                f"{where}.split",
                f"split {o.split!r} is not evaluated{suggest(o.split, splits)}; eval.splits: "
                f"{', '.join(exp.eval.splits)}"
                + ("" if exp.eval.loss_items else " (no eval.loss_items: no loss_ splits)"),
            )
        )
    elif o.split in _loss_splits(exp) and o.metric not in LOSS_POOL_METRICS:
        errors.append(
            (
                f"{where}.metric",
                f"the loss pool ({o.split}) has {' and '.join(LOSS_POOL_METRICS)} only, not {o.metric!r}",
            )
        )
    for i, task in enumerate(o.tasks or []):
        if task not in tasks:
            errors.append((f"{where}.tasks[{i}]", f"unknown task {task!r}{suggest(task, tasks)}"))
    chosen = o.tasks or tasks
    for task in o.weights or {}:
        if task not in chosen:
            errors.append((f"{where}.weights.{task}", f"{task!r} is not among the objective's tasks"))
    if o.stage is not None and o.stage not in stages:
        errors.append(
            (f"{where}.stage", f"unknown stage {o.stage!r}{suggest(o.stage, stages)}; stages: {', '.join(stages)}")
        )
    stage = o.stage if o.stage in stages else stages[-1]
    direction = o.direction or ("minimize" if o.metric in LOWER_IS_BETTER else "maximize")
    return Objective(o.metric, o.split, list(chosen), o.reduce, o.weights, stage, stages.index(stage), direction)


def _resolve_objectives(spec: SweepSpec, exp: Experiment, errors: Errors) -> list[Objective]:
    if spec.objective:
        return [_resolve_objective(spec.objective, "objective", exp, errors)]
    return [_resolve_objective(o, f"objectives[{i}]", exp, errors) for i, o in enumerate(spec.objectives)]


def _dry_values(p: Param) -> list[Any]:
    """Values that span what the entry can take: both ends of a range, every choice, uniform simplex weights."""
    s = p.spec
    if p.kind == "simplex":
        return [{t: 1.0 / len(s.simplex) for t in s.simplex}]
    if p.kind in ("float", "int", "fraction"):
        return list(s.range)
    return list(s.choices)


def _place_errors(p: Param, tasks: list[str]) -> Errors:
    """A simplex must sit at a stage's mixture and a fraction at a counts entry, both naming known tasks."""
    where, parts, errors = f"space.{p.path}", p.parts, []
    if p.kind == "simplex":
        if not (
            len(parts) in (3, 4)
            and parts[0] == "stages"
            and parts[2] == "mixture"
            and (len(parts) == 3 or parts[3] == "weights")
        ):
            return [(where, "simplex applies to a stage's mixture: stages.<stage>.mixture")]
        for i, task in enumerate(p.spec.simplex):
            if task not in tasks:
                errors.append(
                    (f"{where}.simplex[{i}]", f"unknown task {task!r}{suggest(task, tasks)}; tasks: {', '.join(tasks)}")
                )
    if p.kind == "fraction":
        if not (len(parts) == 5 and parts[0] == "stages" and parts[2:4] == ["mixture", "counts"]):
            return [(where, "fraction applies to a counts mixture entry: stages.<stage>.mixture.counts.<task>")]
        task = p.spec.of or str(parts[-1])
        if task not in tasks:
            errors.append(
                (
                    f"{where}.of" if p.spec.of else where,
                    f"unknown task {task!r}{suggest(task, tasks)}; tasks: {', '.join(tasks)}",
                )
            )
    return errors


def _check_param(sweep: Sweep, p: Param, errors: Errors) -> None:
    """The entry sits where its kind applies, and every value it can take keeps the experiment valid."""
    where = f"space.{p.path}"
    errors += _place_errors(p, list(sweep.base.tasks))
    if any(e[0].startswith(where) for e in errors):
        return
    for value in _dry_values(p):
        raw = copy.deepcopy(sweep.base_raw)
        try:
            p.apply(raw, value)
            validate_data(raw, sweep.source)
        except PathError as e:
            errors.append((where, str(e)))
            return
        except ConfigError as e:
            shown = repr(value) if p.kind != "simplex" else "uniform weights"
            own = format_path(p.parts)
            for path, msg in e.errors:
                if path == own:
                    errors.append((where, msg if msg.startswith("unknown key") else f"with {shown}: {msg}"))
                else:
                    errors.append((where, f"with {shown}: {path or 'the experiment'}: {msg}"))
            return


def _section(error: tuple[str, str]) -> int:
    """Where an error's section comes in the sweep file (unknown sections last)."""
    head = re.split(r"[.\[]", error[0])[0]
    return SECTION_ORDER.index(head) if head in SECTION_ORDER else len(SECTION_ORDER)


def _study_errors(sweep: Sweep) -> Errors:
    """The sampler and pruner can be built with their arguments (and the gp sampler's scipy is there)."""
    errors: Errors = []
    for label, make in (("sampler", lambda: make_sampler(sweep, 0)), ("pruner", lambda: make_pruner(sweep))):
        try:
            make()
        except ImportError as e:
            errors.append((f"study.{label}", str(e)))
        except (TypeError, ValueError) as e:
            errors.append((f"study.{label}_args", f"{getattr(sweep.spec.study, label)}: {e}"))
    return errors


def _proxy_overlaps(spec: SweepSpec) -> Errors:
    """A proxy path that a space path also sets (or lies inside, or contains): the space's value would replace the
    proxy's in every trial, or the proxy would be half applied."""
    errors: Errors = []
    for key in spec.proxy or {}:
        for path in spec.space:
            if key == path or key.startswith(path + ".") or path.startswith(key + "."):
                errors.append((f"proxy.{key}", f"also set by space.{path}: a proxy may not change what is swept"))
    return errors


def load_sweep(path: str | Path, overrides: list[str] | None = None) -> Sweep:
    """Load and validate a sweep file (``--set`` items applied); raises :class:`ConfigError` listing every error.

    The base experiment is read relative to the sweep file, the sweep's ``overrides`` applied, and validated; every
    space path must lead into the experiment (stages by index or name) and every value the space can take must
    keep it valid; objectives must name evaluated metrics, splits, tasks and stages.
    """
    path = Path(path)
    source = str(path)
    spec = _read_spec(path, overrides)
    base_raw, base = _read_base(path, spec)
    name = spec.study.name or re.sub(
        r"[^A-Za-z0-9_.-]", "_", path.stem if path.name != RESOLVED_NAME else path.parent.name
    )
    errors: Errors = []
    try:  # a default from a file named "...yaml" (stem "..") must not name a directory either
        check_safe_name(name, "study name")
    except ValueError as e:
        raise ConfigError(
            source, [("study.name", f"{e} (the default: the sweep file's stem; set study.name)")]
        ) from None
    params = _resolve_params(spec, base_raw, errors)
    errors += _proxy_overlaps(spec)
    objectives = _resolve_objectives(spec, base, errors)
    sweep = Sweep(spec, source, name, base_raw, base, params, objectives, full_raw=_full_raw(path, spec))
    for p in params:
        if not any(e[0] == f"space.{p.path}" for e in errors):
            _check_param(sweep, p, errors)
    if errors:
        raise ConfigError(source, sorted(errors, key=_section))
    if sweep.multi and spec.study.pruner != "none":
        sweep.notes.append(
            f"study.pruner: {spec.study.pruner} is turned off: optuna's pruners do not support "
            "multi-objective studies, so every trial runs to the end"
        )
    if sweep.multi and spec.study.sampler == "tpe":
        sweep.notes.append("study.sampler: tpe on several objectives; nsga2 is the usual choice for a Pareto front")
    errors = _study_errors(sweep)
    if errors:
        raise ConfigError(source, errors)
    return sweep


def load_resolved(sweep_dir: Path) -> Sweep:
    """The sweep of a sweep directory (its ``sweep.resolved.yaml``)."""
    return load_sweep(Path(sweep_dir) / RESOLVED_NAME)
