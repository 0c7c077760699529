"""Stage mixtures: the forms a stage's ``mixture`` takes (weights, natural, counts, adaptive) and their parsing, with
every error named by its YAML path (``stages[1].mixture.yesno``).

An adaptive mixture (``{adaptive: {method: odm}}``) is parsed into an :class:`AdaptiveSpec` whose every field is
resolved (defaults filled), so the stage's resolved config — and with it the stage-cache key — names all of it. The
method is looked up in :data:`harness.core.registry.MIXTURE_CONTROLLERS` (filled by :mod:`harness.data.steering`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from harness.config.errors import yaml_errors
from harness.core.registry import MIXTURE_CONTROLLERS, suggest

STEERING_SPLITS = ("heldout_template", "heldout")  # what a steering split imitates (never with one of their examples)
STEERING_METRICS = ("greedy", "tf_exact", "tf_first")
STEERING_UPDATES = 14  # every: auto (steering_error's default) → ⌊steps/14⌉ steps: a measurement costs an evaluation


@dataclass(frozen=True)
class SteeringSplit:
    """The items a ``steering_error`` signal is measured on: ``items`` per steered task, drawn like the task's
    ``split`` (another draw of its recipe) but never one of the examples of any pool the run trains on or reports
    (:mod:`harness.data.steering_items`); ``metric``: the proportion measured on them (greedy exact match, or a
    teacher-forced one)."""

    split: str = "heldout_template"
    metric: str = "greedy"
    items: int = 32

    def to_yaml(self) -> dict[str, Any]:
        return {"split": self.split, "metric": self.metric, "items": self.items}


@dataclass(frozen=True)
class AdaptiveSpec:
    """A resolved adaptive mixture: the controller (``method``) and the settings every controller shares.

    ``start``: ``{}`` for natural (pool sizes) over every task of ``tasks``, else the explicit start weights;
    ``every``: steps between updates, or ``auto`` — ⌊steps / 14⌉, at least 1 (:func:`update_interval`); ``floor``:
    each task's sampling probability is at least this (the controller's output is mixed with the uniform
    distribution: p ← (1 − K·floor)·p + floor); ``signal``: what the controller
    reads (``train_loss``: the per-task training cross-entropy of the steps since the last update;
    ``steering_error``: one minus a metric on the stage's steering split, measured at each update); ``params``: the
    method's own settings, defaults filled (odm: ``alpha``; doremi: ``eta``, ``smoothing``, ``reference``);
    ``steering``: the steering split, for the signal ``steering_error`` only."""

    method: str
    tasks: tuple[str, ...]
    start: tuple[tuple[str, float], ...]  # empty: natural
    every: int | str
    floor: float
    signal: str
    params: tuple[tuple[str, Any], ...]
    steering: SteeringSplit | None = None

    def param(self, name: str) -> Any:
        return dict(self.params)[name]

    def to_yaml(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "tasks": list(self.tasks),
            "start": dict(self.start) if self.start else "natural",
            "every": self.every,
            "floor": self.floor,
            "signal": self.signal,
            **({"steering": self.steering.to_yaml()} if self.steering else {}),
            **{k: _yaml_value(v) for k, v in self.params},
        }


def update_interval(spec: AdaptiveSpec, steps: int) -> int:
    """The steps between a stage's controller updates: ``every``, or for ``auto`` ⌊steps / STEERING_UPDATES⌉ (at
    least 1), so that a measured signal costs about STEERING_UPDATES evaluations whatever the stage's length."""
    return spec.every if isinstance(spec.every, int) else max(1, round(steps / STEERING_UPDATES))


def _yaml_value(value: Any) -> Any:
    return dict(value) if isinstance(value, tuple) and value and isinstance(value[0], tuple) else value


@dataclass(frozen=True)
class Mixture:
    """A parsed stage mixture. ``kind`` is one of:

    - ``weights``: each example drawn picks task t with probability w_t / Σw (0 allowed);
    - ``natural``: the listed tasks' pools are concatenated and shuffled, so a task's share is its pool size;
    - ``counts``: exactly n_t examples of task t in the stage, drawn without replacement unless ``replace``;
    - ``adaptive``: weights that a controller moves as the stage trains (``adaptive``); ``weights`` holds its tasks.
    """

    kind: Literal["weights", "natural", "counts", "adaptive"]
    weights: dict[str, float]
    counts: dict[str, int]
    replace: bool = False
    adaptive: AdaptiveSpec | None = None  # kind adaptive: the controller and its settings

    @property
    def tasks(self) -> list[str]:
        """Tasks that can appear in this stage."""
        if self.kind == "weights":
            return [t for t, w in self.weights.items() if w > 0]
        if self.kind == "counts":
            return [t for t, n in self.counts.items() if n > 0]
        return list(self.weights)

    def to_yaml(self) -> Any:
        if self.kind == "weights":
            return {"weights": dict(self.weights)}
        if self.kind == "natural":
            return {"natural": list(self.weights)}
        if self.kind == "adaptive":
            return {"adaptive": self.adaptive.to_yaml()}
        return {"counts": dict(self.counts), "replace": self.replace}


def parse_mixture(raw: Any, path: str, tasks: list[str], errors: list[tuple[str, str]]) -> Mixture | None:  # noqa: C901 — the mixture grammar: one branch per accepted form, each with its own message
    """Parse a stage's ``mixture`` value, appending ``(yaml_path, message)`` to ``errors``; None if invalid."""
    n_before = len(errors)

    def err(where: str, message: str) -> None:
        errors.append((where, message))

    def check_tasks(names: Any, where: str) -> None:
        for name in names:
            if name not in tasks:
                err(f"{where}.{name}", f"unknown task {name!r}{suggest(str(name), tasks)}; tasks: {', '.join(tasks)}")

    if raw == "natural":
        return Mixture("natural", {t: 1.0 for t in tasks}, {})
    if isinstance(raw, str):
        return err(
            path,
            f"unknown mixture {raw!r}{suggest(raw, ['natural'])}; use natural, {{task: weight}}, "
            "{natural: [tasks]} or {counts: {task: n}}",
        )
    if not isinstance(raw, dict) or not raw:
        return err(path, "mixture is empty; give {task: weight}, natural, {natural: [tasks]} or {counts: {task: n}}")

    if "adaptive" in raw:
        return parse_adaptive(raw, path, tasks, errors)
    keywords = {"weights", "natural", "counts", "replace"}
    if set(raw) & keywords:
        unknown = set(raw) - keywords
        for key in sorted(unknown):
            err(f"{path}.{key}", f"unknown mixture key {key!r}{suggest(key, sorted(keywords))}")
        kinds = [k for k in ("weights", "natural", "counts") if k in raw]
        if len(kinds) != 1:
            return err(path, "give exactly one of weights, natural, counts")
        kind, where = kinds[0], f"{path}.{kinds[0]}"
        if "replace" in raw and kind != "counts":
            err(f"{path}.replace", "replace applies to counts only")
        if kind == "natural":
            names = raw["natural"]
            if not isinstance(names, list) or not names:
                return err(where, "natural needs a non-empty list of task names")
            check_tasks(names, where)
            return None if len(errors) > n_before else Mixture("natural", {t: 1.0 for t in names}, {})
        values = raw[kind]
        if not isinstance(values, dict) or not values:
            return err(where, f"{kind} needs a non-empty mapping of task to number")
    else:
        kind, where, values = "weights", path, raw

    check_tasks(values, where)
    parsed: dict[str, float] = {}
    for name, value in values.items():
        if kind == "counts":
            if isinstance(value, bool) or not isinstance(value, int):
                err(f"{where}.{name}", f"count must be a whole number, got {value!r}")
            elif value < 0:
                err(f"{where}.{name}", "count must be >= 0")
            else:
                parsed[name] = value
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            err(f"{where}.{name}", f"weight must be a finite number, got {value!r}")
        elif value < 0:
            err(f"{where}.{name}", "weight must be >= 0")
        else:
            parsed[name] = float(value)
    if len(errors) > n_before:
        return None
    if not any(v > 0 for v in parsed.values()):
        return err(where, f"every {'count' if kind == 'counts' else 'weight'} is zero: the stage would have no data")
    if kind == "counts":
        replace = raw.get("replace", False)
        if not isinstance(replace, bool):
            return err(f"{path}.replace", "replace must be true or false")
        return Mixture("counts", {t: 1.0 for t in parsed}, {t: int(v) for t, v in parsed.items()}, replace)
    return Mixture("weights", parsed, {})


_SHARED_KEYS = ("method", "tasks", "start", "every", "floor", "signal", "steering")


def parse_adaptive(raw: dict, path: str, tasks: list[str], errors: list[tuple[str, str]]) -> Mixture | None:
    """``{adaptive: {method: …}}`` → a Mixture of kind ``adaptive``, every setting resolved; None if invalid."""
    n_before = len(errors)
    where = f"{path}.adaptive"
    for key in sorted(set(raw) - {"adaptive"}):
        errors.append((f"{path}.{key}", "an adaptive mixture takes no other key"))
    spec = raw["adaptive"]
    if not isinstance(spec, dict) or "method" not in spec:
        errors.append((where, f"adaptive needs a method: {{method: {' | '.join(MIXTURE_CONTROLLERS.names())}}}"))
        return None
    method = spec["method"]
    if not isinstance(method, str) or method not in MIXTURE_CONTROLLERS:
        known = MIXTURE_CONTROLLERS.names()
        errors.append(
            (f"{where}.method", f"unknown method {method!r}{suggest(str(method), known)}; known: {', '.join(known)}")
        )
        return None
    controller = MIXTURE_CONTROLLERS.get(method)
    defaults = dict(controller.defaults)
    for key in sorted(set(spec) - set(_SHARED_KEYS) - set(defaults)):
        errors.append(
            (
                f"{where}.{key}",
                f"unknown setting {key!r} of method {method}"
                f"{suggest(key, [*_SHARED_KEYS, *defaults])}; settings: "
                f"{', '.join([*_SHARED_KEYS[1:], *defaults])}",
            )
        )
    chosen = _adaptive_tasks(spec, where, tasks, errors)
    start = _adaptive_start(spec.get("start", "natural"), f"{where}.start", chosen, errors)
    signal = spec.get("signal", controller.signals[0])
    if signal not in controller.signals:
        errors.append((f"{where}.signal", f"method {method} reads {' | '.join(controller.signals)}, got {signal!r}"))
    steering = _steering_split(spec, signal, f"{where}.steering", errors)
    every = spec.get("every", "auto" if signal == "steering_error" else 1)
    if every != "auto" and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        errors.append((f"{where}.every", f"every must be auto or a whole number of steps >= 1, got {every!r}"))
    floor = spec.get("floor", 0.01)
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 <= floor * max(1, len(chosen)) < 1:
        errors.append(
            (f"{where}.floor", f"floor must be a number in [0, 1/K) for K = {len(chosen)} tasks, got {floor!r}")
        )
    own = {key: spec[key] for key in defaults if key in spec}
    try:
        controller.Params.model_validate(own, context={"tasks": chosen, "signal": signal})
    except ValidationError as e:
        errors += [(f"{where}.{p}" if p else where, m) for p, m in yaml_errors(e, controller.Params)]
    params = []
    for key, default in defaults.items():  # the values as written (the stage's key and resolved file show them)
        value = spec.get(key, default)
        params.append((key, tuple(sorted(value.items())) if isinstance(value, dict) else value))
    if len(errors) > n_before:
        return None
    adaptive = AdaptiveSpec(
        method, tuple(chosen), tuple(start.items()), every, float(floor), signal, tuple(params), steering
    )
    return Mixture("adaptive", {t: 1.0 for t in chosen}, {}, adaptive=adaptive)


def _steering_split(spec: dict, signal: str, where: str, errors: list[tuple[str, str]]) -> SteeringSplit | None:
    """The steering split of a ``steering_error`` signal (defaults filled); None for any other signal."""
    raw = spec.get("steering", {})
    if signal != "steering_error":
        if "steering" in spec:
            errors.append((where, f"a steering split is read by the signal steering_error only, not {signal!r}"))
        return None
    if not isinstance(raw, dict):
        errors.append((where, f"steering must be {{split, metric, items}}, got {raw!r}"))
        return None
    default = SteeringSplit()
    for key in sorted(set(raw) - {"split", "metric", "items"}):
        errors.append((f"{where}.{key}", f"unknown key {key!r}{suggest(str(key), ['split', 'metric', 'items'])}"))
    split, metric, items = (raw.get(k, getattr(default, k)) for k in ("split", "metric", "items"))
    if split not in STEERING_SPLITS:
        errors.append((f"{where}.split", f"split must be one of {', '.join(STEERING_SPLITS)}, got {split!r}"))
    if metric not in STEERING_METRICS:
        errors.append((f"{where}.metric", f"metric must be one of {', '.join(STEERING_METRICS)}, got {metric!r}"))
    if isinstance(items, bool) or not isinstance(items, int) or items < 8:
        errors.append((f"{where}.items", f"items must be a whole number >= 8 per task, got {items!r}"))
    return SteeringSplit(split, metric, items)


def _adaptive_tasks(spec: dict, where: str, tasks: list[str], errors: list[tuple[str, str]]) -> list[str]:
    """The adaptive mixture's tasks: ``tasks`` if given, else those of explicit start weights, else every task."""
    if "tasks" in spec:
        chosen = spec["tasks"]
        if not isinstance(chosen, list) or len(chosen) < 2:
            errors.append((f"{where}.tasks", "tasks needs a list of at least two task names"))
            return []
    elif isinstance(spec.get("start"), dict):
        chosen = [t for t, w in spec["start"].items()]
    else:
        chosen = list(tasks)
    for name in chosen:
        if name not in tasks:
            errors.append(
                (f"{where}.tasks", f"unknown task {name!r}{suggest(str(name), tasks)}; tasks: {', '.join(tasks)}")
            )
    if len(chosen) < 2 and "tasks" not in spec:
        errors.append((where, "an adaptive mixture needs at least two tasks"))
    return [str(t) for t in chosen]


def _adaptive_start(raw: Any, where: str, chosen: list[str], errors: list[tuple[str, str]]) -> dict[str, float]:
    """``{}`` for natural, else the explicit start weights (every chosen task, each > 0)."""
    if raw == "natural":
        return {}
    if not isinstance(raw, dict):
        errors.append((where, f"start must be natural or {{task: weight}}, got {raw!r}"))
        return {}
    out = {}
    for name in chosen:
        value = raw.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            errors.append(
                (
                    f"{where}.{name}",
                    f"start weight must be a number > 0 (a controller cannot raise a task from zero), got {value!r}",
                )
            )
        else:
            out[name] = float(value)
    for name in raw:
        if name not in chosen:
            errors.append((f"{where}.{name}", f"{name!r} is not one of the mixture's tasks ({', '.join(chosen)})"))
    return out
