"""``harness repro NAME``: run a published finding's experiment files for several seeds and tabulate them.

A reproduction is a directory ``experiments/repro/NAME/`` holding experiment files and ``repro.yaml``, which says
what is measured and which arms to run::

    title: Reversed digits make addition learnable
    source: Lee et al. 2023, "Teaching Arithmetic to Small Transformers"
    published: reversed 0.92 vs plain 0.08 held-out exact match at 900 steps
    metrics: [{task: math, split: heldout, metric: greedy}]     # per-item rates; the first is the headline
    arms:                                                       # arm → experiment file (+ overrides)
      reversed: reversed.yaml
      plain: {file: plain.yaml, set: ["tasks.math.params.format=plain"], x: 0.5}
    scale: [stages.0.steps]           # integer fields multiplied by --scale
    micro: ["stages.0.steps=4", ...]  # overrides for the micro size the default test suite runs
    expect: {higher: reversed, lower: plain}   # the published direction, asserted by the slow test

Each (arm, seed) runs into ``OUT/runs/ARM/seedS`` (a finished run — one with ``summary.json`` — of the same
resolved experiment is reused, so an interrupted ``repro`` continues where it stopped; an unfinished run, or one of
another configuration, is run again); then ``OUT/NAME.md`` (the table), ``OUT/NAME.png`` (the figure)
and ``OUT/results.json`` are written by :mod:`harness.studies.repro.report`.

Exit codes (through the CLI): 2 for an unknown reproduction or an invalid ``repro.yaml`` / arm file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.config import ConfigError, Experiment
from harness.config.errors import yaml_errors
from harness.config.load import apply_overrides, resolve_file_paths, validate_data
from harness.config.paths import PathError, parse_path, resolve_path, set_path
from harness.config.yaml_io import load_raw
from harness.studies.launch import Launcher, LauncherSpec
from harness.studies.launch.local import LocalLauncher
from harness.studies.repro.jobs import PlannedRun, run_planned

REPRO_ROOT = Path(__file__).resolve().parents[3] / "experiments" / "repro"  # harness/studies/repro/ → the project
SPEC_NAME = "repro.yaml"


class MetricRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: str
    split: str = "heldout"
    metric: str = "greedy"

    @property
    def label(self) -> str:
        return f"{self.task}/{self.split}/{self.metric}"


class Arm(BaseModel):
    model_config = ConfigDict(extra="forbid")
    file: str = Field(description="Experiment file, relative to the reproduction's directory.")
    set: list[str] = Field(default_factory=list, description="--set overrides for this arm.")
    x: float | None = Field(
        None, description="Position on the figure's x axis (a swept value); arms without one are drawn as bars."
    )
    micro: list[str] = Field(default_factory=list, description="Extra overrides for this arm at the micro size.")
    optional: bool = Field(False, description="Run only when named in --arms (a costly extra arm).")


class Expect(BaseModel):
    model_config = ConfigDict(extra="forbid")
    higher: str = Field(description="The arm the publication finds better on the headline metric.")
    lower: str = Field(description="The arm it finds worse.")


class ReproSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str
    source: str
    published: str
    metrics: list[MetricRef] = Field(min_length=1)
    arms: dict[str, str | Arm] = Field(min_length=1)
    scale: list[str] = Field(default_factory=list, description="Integer fields multiplied by --scale.")
    micro: list[str] = Field(default_factory=list, description="Overrides giving the micro size (tests).")
    expect: Expect | None = None
    x_label: str | None = None
    x_log: bool = False
    launcher: LauncherSpec | None = Field(None, description="Where the runs go with --launcher slurm.")

    def arm(self, name: str) -> Arm:
        value = self.arms[name]
        return Arm(file=value) if isinstance(value, str) else value


@dataclass
class Repro:
    name: str
    directory: Path
    spec: ReproSpec


def available(root: Path = REPRO_ROOT) -> list[str]:
    """Names of the reproductions under ``root`` (directories with a ``repro.yaml``)."""
    return sorted(p.parent.name for p in root.glob(f"*/{SPEC_NAME}"))


def load_repro(name_or_dir: str | Path, root: Path = REPRO_ROOT) -> Repro:
    """The reproduction called ``name_or_dir`` under ``root``, or the one in that directory; ConfigError if
    there is none or its ``repro.yaml`` is invalid (every error with its YAML path)."""
    directory = Path(name_or_dir)
    if not (directory / SPEC_NAME).is_file():
        directory = root / str(name_or_dir)
    spec_path = directory / SPEC_NAME
    if not spec_path.is_file():
        raise ConfigError(
            str(name_or_dir), [("", f"no reproduction of that name; known: {', '.join(available(root))}")]
        )
    try:
        spec = ReproSpec.model_validate(load_raw(spec_path))
    except ValidationError as e:
        raise ConfigError(str(spec_path), yaml_errors(e, ReproSpec)) from None
    errors = [
        (f"arms.{n}.file", f"{spec.arm(n).file}: no such file")
        for n in spec.arms
        if not (directory / spec.arm(n).file).is_file()
    ]
    if spec.expect:
        errors += [
            (f"expect.{k}", f"{v!r} is not an arm") for k, v in spec.expect.model_dump().items() if v not in spec.arms
        ]
    if errors:
        raise ConfigError(str(spec_path), errors)
    return Repro(directory.name, directory, spec)


def _scaled(raw: dict[str, Any], paths: list[str], scale: float, source: str) -> dict[str, Any]:
    """``raw`` with each integer field at ``paths`` multiplied by ``scale`` (rounded, at least 1)."""
    for dotted in paths:
        try:
            parts = resolve_path(raw, parse_path(dotted))
        except PathError as e:
            raise ConfigError(source, [(f"scale: {dotted}", str(e))]) from None
        node: Any = raw
        for part in parts:
            node = node[part] if isinstance(node, list) else (node or {}).get(part)
        if not isinstance(node, int) or isinstance(node, bool):
            raise ConfigError(source, [(f"scale: {dotted}", f"is {node!r}, not an integer")])
        set_path(raw, parts, max(1, round(node * scale)))
    return raw


def arm_experiment(repro: Repro, arm: str, seed: int, scale: float = 1.0, micro: bool = False) -> Experiment:
    """The validated experiment of ``arm`` for ``seed``: its file, its overrides, the scale, then the micro size."""
    spec = repro.spec
    path = repro.directory / spec.arm(arm).file
    raw = load_raw(path)
    overrides = [f"seed={seed}"] + ([*spec.micro, *spec.arm(arm).micro] if micro else [])
    try:
        raw = apply_overrides(raw, spec.arm(arm).set)
        raw = _scaled(raw, spec.scale, scale, str(path))
        raw = apply_overrides(raw, overrides)
    except ValueError as e:
        raise ConfigError(str(path), [("", str(e))]) from None
    source = f"{path} (arm {arm})"
    return validate_data(resolve_file_paths(raw, path.resolve().parent, source), source)


# ---- running and collecting --------------------------------------------------------------------------------------


@dataclass
class RunOutcome:
    """One (arm, seed) run's final value of each metric with the n it is a rate over."""

    arm: str
    seed: int
    values: dict[str, float] = field(default_factory=dict)  # metric label → rate
    n: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    run_dir: str = ""
    # greedy metrics: item index → correct, from samples.jsonl (for paired item-level tests between arms)
    items: dict[str, dict[int, bool]] = field(default_factory=dict)
    data_seed: int | None = None  # the task data's seed: runs with the same one were scored on the same items


def _final_samples(run_dir: Path) -> list[dict[str, Any]]:
    """The ``samples.jsonl`` records of the run's last evaluation (none when the file is missing or empty)."""
    path = run_dir / "samples.jsonl"
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    last = max((r.get("step", 0) for r in records), default=0)
    return [r for r in records if r.get("step", 0) == last]


def collect_run(run_dir: Path, arm: str, seed: int, metrics: list[MetricRef], exp: Experiment) -> RunOutcome:
    """The final metrics of a finished run (its last stage's end); n from ``samples.jsonl``, else the task's
    ``eval`` size. A metric the run did not record is NaN."""
    summary = json.loads((run_dir / "summary.json").read_text())
    table = summary["stages"][-1]["metrics"] if summary.get("stages") else {}
    samples = _final_samples(run_dir)
    outcome = RunOutcome(
        arm,
        seed,
        seconds=summary.get("timing", {}).get("total_s", 0.0),
        run_dir=str(run_dir),
        data_seed=exp.data_seed if exp.data_seed is not None else exp.seed,
    )
    for m in metrics:
        outcome.values[m.label] = float(table.get(m.split, {}).get(m.task, {}).get(m.metric, math.nan))
        mine = [r for r in samples if (r["task"], r["split"]) == (m.task, m.split)]
        outcome.n[m.label] = len(mine) or (exp.tasks[m.task].eval if m.task in exp.tasks else 0)
        if m.metric == "greedy" and mine:
            outcome.items[m.label] = {int(r["index"]): bool(r["correct"]) for r in mine}
    return outcome


def run_repro(
    repro: Repro,
    seeds: list[int],
    out: Path,
    scale: float = 1.0,
    micro: bool = False,
    arms: list[str] | None = None,
    echo: Callable[[str], None] = print,
    jobs: int = 1,
    launcher: Launcher | None = None,
) -> list[RunOutcome] | None:
    """Run every arm for every seed into ``out/runs``, reusing finished runs; returns one outcome per run, seed-major
    (all arms of seed 0 first), or None when ``launcher`` left its jobs running (detached). Experiments are all
    validated before the first run starts. ``jobs > 1`` runs that many at once, each in its own process;
    ``launcher`` (default: this machine, ``jobs`` at a time) may send them to a cluster instead."""
    from harness.runs.execution.rundir import LOCK_FILE
    from harness.runs.execution.runner import changed_sections  # torch and transformers: only when something runs

    names = list(dict.fromkeys(arms or [a for a in repro.spec.arms if not repro.spec.arm(a).optional]))
    unknown = [a for a in names if a not in repro.spec.arms]
    if unknown:
        raise ConfigError(
            repro.name, [("--arms", f"unknown arm(s) {', '.join(unknown)}; arms: {', '.join(repro.spec.arms)}")]
        )
    plan = [(arm, seed, arm_experiment(repro, arm, seed, scale, micro)) for seed in seeds for arm in names]
    outcomes: dict[tuple[str, int], RunOutcome] = {}

    def collect(arm: str, seed: int, exp: Experiment) -> None:
        outcome = collect_run(out / "runs" / arm / f"seed{seed}", arm, seed, repro.spec.metrics, exp)
        echo(f"{arm} seed {seed}: " + ", ".join(f"{k} {v:.3f} (n={outcome.n[k]})" for k, v in outcome.values.items()))
        outcomes[arm, seed] = outcome

    todo = []
    for arm, seed, exp in plan:
        run_dir = out / "runs" / arm / f"seed{seed}"
        finished = (run_dir / "summary.json").is_file() and (run_dir / "config.resolved.yaml").is_file()
        changed = changed_sections(exp, run_dir) if finished else []
        if finished and not changed:
            echo(f"{arm} seed {seed}: finished run reused ({run_dir})")
            collect(arm, seed, exp)
            continue
        # A run of another configuration (--micro before the full size, an edited repro file), or one an
        # interrupted repro left unfinished, is run again (finished stages replay from the stage cache). A run
        # still going in another process keeps its lock, so force cannot clear it.
        used = run_dir.is_dir() and any(p.name != LOCK_FILE for p in run_dir.iterdir())
        why = (
            f"the finished run differs in {', '.join(changed)}: to run again"
            if changed
            else "unfinished, to restart"
            if used
            else "to run"
        )
        echo(f"{arm} seed {seed}: {why} → {run_dir}")
        todo.append(PlannedRun(arm, seed, exp, run_dir, used))
    launcher = launcher or LocalLauncher(jobs, echo)
    if not run_planned(todo, launcher, lambda run: collect(run.arm, run.seed, run.exp)):
        return None
    return [outcomes[arm, seed] for arm, seed, _ in plan]


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` → ``[0, 1, 2]``; ValueError naming the bad item."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds {text!r}: expected comma-separated integers like 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r}: expected distinct comma-separated integers like 0,1,2")
    return seeds
