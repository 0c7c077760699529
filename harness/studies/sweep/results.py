"""Sweep results: ``trials.parquet`` (one row per trial) and the status report of ``harness sweep-status``.

``trials.parquet`` columns (read by the analysis code; keep them stable):

| column | type | content |
|---|---|---|
| ``number`` | int | optuna trial number |
| ``state`` | str | COMPLETE, PRUNED, FAIL or RUNNING (enqueued trials not yet started are left out) |
| ``objective`` / ``objective_0``, ``objective_1``, … | float | the objective (one objective / several); see below |
| ``param/<space path>`` | float / int / str | every non-simplex parameter as sampled (a ``fraction`` is k) |
| ``param/<space path>.<task>`` | float | every normalised simplex weight |
| ``metric/<stage>/<split>/<task>/<metric>`` | float | per-task metrics of each stage's last evaluation |
| ``duration_s`` | float | wall-clock seconds of the trial |
| ``trial_dir`` | str | the trial's run directory (absolute) |
| ``fail_reason`` | str | why a FAIL trial failed (null otherwise) |
| ``pruned_step`` | int | global step at which a PRUNED trial was stopped (null otherwise) |

For a PRUNED trial, the objective columns hold its last reported value.

Everything comes from the optuna storage (trial params and user attributes), so any machine that reaches the
storage can rebuild the table.
"""

from __future__ import annotations

import io
import math
import warnings
from pathlib import Path
from typing import Any

import optuna
import polars as pl
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from harness.core.store import atomic_write_bytes
from harness.studies.sweep.space import Sweep

TRIALS_NAME = "trials.parquet"
SHOWN_STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING")


def _duration(t) -> float | None:
    if "duration_s" in t.user_attrs:
        return float(t.user_attrs["duration_s"])
    if t.datetime_start is not None and t.datetime_complete is not None:
        return (t.datetime_complete - t.datetime_start).total_seconds()
    return None


def objective_columns(sweep: Sweep) -> list[str]:
    return [f"objective_{i}" for i in range(len(sweep.objectives))] if sweep.multi else ["objective"]


def trials_frame(study, sweep: Sweep) -> pl.DataFrame:  # noqa: C901 — one branch per trial column family (params, metrics, attributes, states)
    """One row per started trial, columns as documented in the module docstring."""
    trials = [t for t in study.get_trials(deepcopy=False) if t.state.name in SHOWN_STATES]
    trials.sort(key=lambda t: t.number)
    objectives = objective_columns(sweep)
    columns: dict[str, list[Any]] = {"number": [], "state": [], **{c: [] for c in objectives}}
    schema: dict[str, Any] = {"number": pl.Int64, "state": pl.Utf8, **{c: pl.Float64 for c in objectives}}
    for p in sweep.params:
        if p.kind == "simplex":
            for task in p.spec.simplex:
                columns[f"param/{p.path}.{task}"], schema[f"param/{p.path}.{task}"] = [], pl.Float64
        else:
            name = f"param/{p.path}"
            columns[name] = []
            if p.kind in ("float", "fraction"):
                schema[name] = pl.Float64
            elif p.kind == "int":
                schema[name] = pl.Int64
            else:
                kinds = {type(c) for c in p.spec.choices if c is not None}
                schema[name] = (
                    pl.Boolean
                    if kinds == {bool}
                    else pl.Int64
                    if kinds == {int}
                    else pl.Float64
                    if kinds and kinds <= {int, float}
                    else pl.Utf8
                )
    stage_order = {s.name: i for i, s in enumerate(sweep.base.stages)}
    metric_keys: set[tuple[str, str, str, str]] = set()
    for t in trials:
        for stage, table in (t.user_attrs.get("stage_metrics") or {}).items():
            for split, tasks in table.items():
                for task, metrics in tasks.items():
                    metric_keys.update((stage, split, task, m) for m in metrics)
    ordered = sorted(metric_keys, key=lambda k: (stage_order.get(k[0], 99), k[0], k[1], k[2], k[3]))
    for key in ordered:
        columns["metric/" + "/".join(key)], schema["metric/" + "/".join(key)] = [], pl.Float64
    for name, dtype in (
        ("duration_s", pl.Float64),
        ("trial_dir", pl.Utf8),
        ("fail_reason", pl.Utf8),
        ("pruned_step", pl.Int64),
    ):
        columns[name], schema[name] = [], dtype

    for t in trials:
        columns["number"].append(t.number)
        columns["state"].append(t.state.name)
        values = t.values or [None] * len(objectives)
        if not sweep.multi and t.values is None and t.state.name == "PRUNED" and t.intermediate_values:
            values = [t.intermediate_values[max(t.intermediate_values)]]
        for c, v in zip(objectives, values):
            columns[c].append(v)
        for p in sweep.params:
            if p.kind == "simplex":
                for task in p.spec.simplex:
                    columns[f"param/{p.path}.{task}"].append(t.user_attrs.get(f"{p.path}.{task}"))
            else:
                v = t.params.get(p.path)
                columns[f"param/{p.path}"].append(
                    str(v) if v is not None and schema[f"param/{p.path}"] == pl.Utf8 else v
                )
        sm = t.user_attrs.get("stage_metrics") or {}
        for key in ordered:
            stage, split, task, metric = key
            v = sm.get(stage, {}).get(split, {}).get(task, {}).get(metric)
            columns["metric/" + "/".join(key)].append(float(v) if v is not None else None)
        columns["duration_s"].append(_duration(t))
        columns["trial_dir"].append(t.user_attrs.get("trial_dir"))
        reason = t.user_attrs.get("fail_reason")
        if t.state.name == "FAIL" and not reason:
            reason = "unknown (the worker ended without a reason: killed, or an older harness)"
        columns["fail_reason"].append(reason if t.state.name == "FAIL" else None)
        columns["pruned_step"].append(t.user_attrs.get("pruned_step") if t.state.name == "PRUNED" else None)
    return pl.DataFrame(columns, schema=schema)


def write_trials(study, sweep: Sweep, sweep_dir: Path) -> Path:
    """Rewrite ``<sweep_dir>/trials.parquet`` atomically (a reader never sees half a file)."""
    frame = trials_frame(study, sweep)
    buffer = io.BytesIO()
    frame.write_parquet(buffer)
    path = Path(sweep_dir) / TRIALS_NAME
    atomic_write_bytes(path, buffer.getvalue())
    return path


# ----------------------------------------------------------------------------------------------------------------
# Reports
# ----------------------------------------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    return str(v)


def params_text(t, sweep: Sweep) -> str:
    parts = []
    for p in sweep.params:
        if p.kind == "simplex":
            ws = [
                f"{task} {t.user_attrs[f'{p.path}.{task}']:.2f}"
                for task in p.spec.simplex
                if f"{p.path}.{task}" in t.user_attrs
            ]
            if ws:
                parts.append(f"{p.path}: " + ", ".join(ws))
        elif p.path in t.params:
            parts.append(f"{p.path}={_fmt(t.params[p.path])}")
    return "; ".join(parts)


def _fail_line(t) -> str:
    """The first line of a FAIL trial's reason, cut to 200 characters."""
    return (t.user_attrs.get("fail_reason") or "no reason recorded").splitlines()[0][:200]


def describe_trial(t, sweep: Sweep) -> str:
    """One line per finished trial (the launcher prints these)."""
    state = t.state.name
    if state == "COMPLETE":
        what = "objective " + ", ".join(_fmt(v) for v in t.values)
    elif state == "PRUNED":
        what = f"at step {t.user_attrs.get('pruned_step')}"
    else:
        what = _fail_line(t)
    duration = _duration(t)
    params = params_text(t, sweep)
    return (
        f"trial {t.number} {state}: {what}"
        + (f" ({duration:.0f} s)" if duration is not None else "")
        + (f" [{params}]" if params else "")
    )


class TrialFollower:
    """What a launching command shows of its sweep as the workers run: each trial once it has finished (again when
    its state changes), ``trials.parquet`` rewritten after any change. Call it once per look at the study."""

    FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)

    def __init__(self, study, sweep: Sweep, sweep_dir: Path, echo=print):
        self.study, self.sweep, self.sweep_dir, self.echo = study, sweep, Path(sweep_dir), echo
        self.seen: dict[int, str] = {}

    def __call__(self, write: bool = True) -> bool:
        """Show the trials finished since the last call; True when there were any."""
        changed = False
        for t in self.study.get_trials(deepcopy=False):
            if t.state in self.FINISHED and self.seen.get(t.number) != t.state.name:
                self.seen[t.number] = t.state.name
                self.echo(describe_trial(t, self.sweep))
                changed = True
        if changed and write:
            write_trials(self.study, self.sweep, self.sweep_dir)
        return changed


def importances(study, sweep: Sweep) -> list[tuple[str, dict[str, float]]] | str:
    """Parameter importances (optuna's default evaluator, PED-ANOVA) over the *normalised* simplex weights and the
    other parameters of COMPLETE trials, one dict per objective; a message when there are too few trials."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    minimum = 4
    if len(complete) < minimum:
        return f"parameter importances need at least {minimum} COMPLETE trials (have {len(complete)})"
    derived = optuna.create_study(directions=sweep.directions)
    for t in complete:
        params, dists = {}, {}
        for p in sweep.params:
            if p.kind == "simplex":
                for task in p.spec.simplex:
                    key = f"{p.path}.{task}"
                    if key in t.user_attrs:
                        params[key], dists[key] = t.user_attrs[key], FloatDistribution(0.0, 1.0)
            elif p.path in t.params:
                params[p.path], dists[p.path] = t.params[p.path], t.distributions[p.path]
        derived.add_trial(create_trial(params=params, distributions=dists, values=t.values))
    out = []
    for i, o in enumerate(sweep.objectives):
        kwargs = {"target": (lambda t, i=i: t.values[i]), "target_name": f"objective_{i}"} if sweep.multi else {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                values = dict(optuna.importance.get_param_importances(derived, **kwargs))
            except Exception as e:  # noqa: BLE001 — too little variation, a single value…: say so, do not crash
                return f"parameter importances unavailable: {type(e).__name__}: {e}"
        note = "; ".join(sorted({str(w.message) for w in caught if issubclass(w.category, UserWarning)}))
        out.append((o.describe() + (f" (optuna: {note})" if note else ""), values))
    return out


def status_text(study, sweep: Sweep, top: int = 5) -> str:
    """Trial counts, compute used and saved by pruning, the best trials (or the Pareto front), importances."""
    trials = [t for t in study.get_trials(deepcopy=False) if t.state.name in SHOWN_STATES]
    counts = {s: sum(t.state.name == s for t in trials) for s in SHOWN_STATES}
    waiting = sum(t.state == TrialState.WAITING for t in study.get_trials(deepcopy=False))
    lines = [
        f"study {sweep.name}: {len(trials)} of {sweep.spec.study.n_trials} trials ("
        + ", ".join(f"{s} {n}" for s, n in counts.items())
        + (f", WAITING {waiting}" if waiting else "")
        + ")"
    ]
    for i, o in enumerate(sweep.objectives):
        lines.append(f"objective{f' {i}' if sweep.multi else ''}: {o.describe()}")
    reached = sum(int(t.user_attrs.get("steps", 0)) for t in trials)  # cached steps included
    cached = sum(int(t.user_attrs.get("cached_steps", 0)) for t in trials)
    pruned = [t for t in trials if t.state.name == "PRUNED"]
    if reached or pruned:
        would = sum(int(t.user_attrs.get("total_steps", 0)) - int(t.user_attrs.get("steps", 0)) for t in pruned)
        line = f"training steps run: {reached - cached}"
        if cached:
            line += (
                f"; the stage cache saved {cached} steps ({cached / max(1, reached + would):.0%} of the steps "
                "the same trials would have run without it)"
            )
        if pruned:
            line += (
                f"; pruning saved {would} steps ({would / max(1, reached + would):.0%} of the steps the same "
                "trials would have run unpruned)"
            )
        lines.append(line)
    durations = [d for d in (_duration(t) for t in trials if t.state.name != "RUNNING") if d]
    if durations:
        lines.append(f"trial time: {sum(durations):.0f} s in all, {sum(durations) / len(durations):.0f} s mean")
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    if not complete:
        lines.append("no COMPLETE trial yet")
    elif sweep.multi:
        front = sorted(study.best_trials, key=lambda t: t.number)
        lines.append(f"Pareto front ({len(front)} trials):")
        lines += [
            f"  trial {t.number}: "
            + ", ".join(f"objective_{i} {_fmt(v)}" for i, v in enumerate(t.values))
            + f"  [{params_text(t, sweep)}]"
            for t in front
        ]
    else:
        sign = -1 if sweep.directions[0] == "maximize" else 1
        best = sorted(complete, key=lambda t: sign * t.values[0])[:top]
        lines.append(f"best trials ({len(best)} of {len(complete)} COMPLETE):")
        lines += [f"  trial {t.number}: objective {_fmt(t.values[0])}  [{params_text(t, sweep)}]" for t in best]
    failed = [t for t in trials if t.state.name == "FAIL"]
    for t in failed[:top]:
        lines.append(f"  FAIL trial {t.number}: {_fail_line(t)}")
    result = importances(study, sweep)
    if isinstance(result, str):
        lines.append(result)
    else:
        for what, values in result:
            lines.append(f"parameter importances (PED-ANOVA; simplex weights normalised) for {what}:")
            lines += [f"  {name}: {value:.3f}" for name, value in values.items()]
    return "\n".join(lines)
