"""Stage mixtures: the three forms a stage's ``mixture`` takes (weights, natural, counts) and their parsing, with
every error named by its YAML path (``stages[1].mixture.yesno``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from harness.core.registry import suggest


@dataclass(frozen=True)
class Mixture:
    """A parsed stage mixture. ``kind`` is one of:

    - ``weights``: each example drawn picks task t with probability w_t / Σw (0 allowed);
    - ``natural``: the listed tasks' pools are concatenated and shuffled, so a task's share is its pool size;
    - ``counts``: exactly n_t examples of task t in the stage, drawn without replacement unless ``replace``.
    """

    kind: Literal["weights", "natural", "counts"]
    weights: dict[str, float]
    counts: dict[str, int]
    replace: bool = False

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
        return {"counts": dict(self.counts), "replace": self.replace}


def parse_mixture(raw: Any, path: str, tasks: list[str], errors: list[tuple[str, str]]) -> Mixture | None:
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
        return err(path, f"unknown mixture {raw!r}{suggest(raw, ['natural'])}; use natural, {{task: weight}}, "
                         "{natural: [tasks]} or {counts: {task: n}}")
    if not isinstance(raw, dict) or not raw:
        return err(path, "mixture is empty; give {task: weight}, natural, {natural: [tasks]} or {counts: {task: n}}")

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
