"""Sweep workers, each running trials of the shared study until the global budget is used, and their launcher
(:func:`run_sweep`: ``python -m harness.studies.sweep.worker`` processes, followed until they all exit).

A trial is a full :func:`harness.runs.execution.runner.run_experiment` in ``<sweep dir>/trials/<number>/``. It reports
its
objective to the pruner at every evaluation (step = global step) and ends as

- COMPLETE with the objective(s) read at the end of the objective's stage;
- PRUNED when the pruner stops it (user attribute ``pruned_step``);
- FAIL with user attribute ``fail_reason`` on any exception (bad sampled config, bad data, a non-finite loss from
  the training guard, a non-finite objective) — the worker then goes on with the next trial.

The budget (``study.n_trials``) counts trials COMPLETE, PRUNED, FAIL or RUNNING; workers on one machine check it
and ask for a trial under a file lock, so the study ends with exactly ``n_trials`` trials.

A worker killed mid-trial cannot say so itself, nor one hung in a step: the trial's heartbeat is written from the
run's progress (:mod:`harness.studies.sweep.heartbeat`), and any worker (and the launching process, which polls) marks a
RUNNING trial silent for ``study.heartbeat.grace`` seconds as FAIL. The launching process also fails at once the
running trials of its own workers that died.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import optuna
import polars as pl
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from harness.config import validate_data
from harness.core.redact import STORAGE_ENV
from harness.studies.sweep.heartbeat import WORKER_ATTR, Heartbeat, fail_stale_trials, fail_trials_of, worker_id
from harness.studies.sweep.load import load_resolved
from harness.studies.sweep.results import TrialFollower, write_trials
from harness.studies.sweep.space import Sweep, sample_values
from harness.studies.sweep.study import (
    budget_lock,
    make_pruner,
    make_sampler,
    make_storage,
    prepare_study,
    quiet_optuna,
)

COUNTED_STATES = ("COMPLETE", "PRUNED", "FAIL", "RUNNING")


# ----------------------------------------------------------------------------------------------------------------
# One trial
# ----------------------------------------------------------------------------------------------------------------


def _finite_or_none(value: Any) -> Any:
    return value if not isinstance(value, float) or math.isfinite(value) else None


class Reporter:
    """The run's ``on_evaluation``: keeps each stage's last evaluation and reports the objective to the pruner. Rows
    sent again at a stage's last step (the loss pool, scored after the stage's last evaluation) join that table."""

    def __init__(self, trial, sweep: Sweep):
        self.trial, self.sweep = trial, sweep
        self.stage_index = {s.name: i for i, s in enumerate(sweep.base.stages)}
        self.tables: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
        self.table_steps: dict[str, int] = {}
        self.first_stage_at: dict[int, str] = {}  # the stage that evaluated at a step first
        self.reported: set[int] = set()  # steps told to the pruner
        self.step = 0

    def __call__(self, stage: str, step: int, rows: list) -> None:
        table = self.tables.get(stage, {}) if self.table_steps.get(stage) == step else {}
        for r in rows:
            if r.task is not None and r.text is None:
                table.setdefault(r.split, {}).setdefault(r.task, {})[r.metric] = r.value
        self.tables[stage], self.table_steps[stage] = table, step
        # A stage starting where the previous one ended repeats that evaluation: nothing new. Rows the same stage
        # sends again at its step (the loss pool's, after its last evaluation) may complete the objective: told once.
        repeated = self.first_stage_at.setdefault(step, stage) != stage or step in self.reported
        self.step = max(self.step, step)
        objective = self.sweep.objectives[0]
        index = self.stage_index.get(stage, 0)
        if self.sweep.multi or repeated or not self.sweep.first_swept_stage <= index <= objective.stage_index:
            return
        try:
            value = objective.value(table)
        except KeyError:
            return
        if not math.isfinite(value):
            return
        self.trial.report(value, step)
        self.reported.add(step)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step}")

    def stage_metrics(self) -> dict[str, Any]:
        """``{stage: {split: {task: {metric: value}}}}`` (non-finite → null: JSON stays valid for the dashboard)."""
        return {
            stage: {
                split: {
                    task: {m: _finite_or_none(float(v)) for m, v in metrics.items()} for task, metrics in tasks.items()
                }
                for split, tasks in table.items()
            }
            for stage, table in self.tables.items()
        }


def cached_steps(trial_dir: Path) -> int:
    """Steps a trial replayed from the stage cache (a prefix of its stages: the last step of its rows marked
    ``cached_from``), read from its store, so a pruned or failed trial counts them too."""
    store = trial_dir / "metrics.parquet"
    if not store.is_file():
        return 0
    rows = pl.read_parquet(store, columns=["step", "cached_from"]).filter(pl.col("cached_from").is_not_null())
    return int(rows["step"].max() or 0) if rows.height else 0


def run_trial(study, trial, sweep: Sweep, sweep_dir: Path, run: Callable[..., Any] | None = None) -> str:
    """Run one asked trial to its end and tell the study; returns the final state's name."""
    if run is None:
        # harness.runs.execution.runner pulls in torch and transformers (seconds): imported when a trial runs, so that
        # ``harness sweep-status`` and the launcher, which only read the study, stay quick to start.
        from harness.runs.execution.runner import run_experiment as run
    trial_dir = (Path(sweep_dir) / "trials" / str(trial.number)).resolve()
    trial.set_user_attr(WORKER_ATTR, worker_id())
    trial.set_user_attr("trial_dir", str(trial_dir))
    reporter = Reporter(trial, sweep)
    started = time.perf_counter()

    def finish(state, values=None, **attrs) -> str:
        attrs.update(
            duration_s=time.perf_counter() - started,
            steps=reporter.step,
            stage_metrics=reporter.stage_metrics(),
            cached_steps=cached_steps(trial_dir),
        )
        try:
            for key, value in attrs.items():
                trial.set_user_attr(key, value)
            study.tell(trial, values, state=state)
        except UpdateFinishedTrialError:
            print(f"trial {trial.number}: already finished by another process (stale heartbeat?)", flush=True)
            return "FAIL"
        return state.name

    try:
        values = sample_values(trial, sweep)
        exp = validate_data(sweep.experiment_raw(values, trial.number), f"trial {trial.number}")
        trial.set_user_attr("total_steps", sum(s.steps for s in exp.resolved_stages()))
        with Heartbeat(study._storage, trial._trial_id, sweep.spec.study.heartbeat.interval) as heartbeat:
            # a beat per step or evaluation finished (rate-limited): a hung step lets the trial go stale
            result = run(exp, trial_dir, on_evaluation=reporter, on_progress=heartbeat.pulse)
        stages = {s["name"]: s.get("metrics") or {} for s in result.summary.get("stages", [])}
        objective_values = [o.value(stages.get(o.stage) or reporter.tables.get(o.stage, {})) for o in sweep.objectives]
        bad = [i for i, v in enumerate(objective_values) if not math.isfinite(v)]
        if bad:
            return finish(TrialState.FAIL, fail_reason=f"non-finite objective: {objective_values}")
        return finish(TrialState.COMPLETE, objective_values)
    except optuna.TrialPruned:
        return finish(TrialState.PRUNED, pruned_step=reporter.step)
    except UpdateFinishedTrialError:
        print(f"trial {trial.number}: marked finished by another process (stale heartbeat?)", flush=True)
        return "FAIL"
    except BaseException as e:  # noqa: BLE001 — every failure is recorded; interrupts are re-raised
        reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        if isinstance(e, KeyboardInterrupt):
            reason = "interrupted"
        trial_dir.mkdir(parents=True, exist_ok=True)
        (trial_dir / "error.txt").write_text(traceback.format_exc())
        state = finish(TrialState.FAIL, fail_reason=reason[:4000])
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return state


# ----------------------------------------------------------------------------------------------------------------
# The worker loop
# ----------------------------------------------------------------------------------------------------------------


def counted_trials(study) -> int:
    """Trials that use the budget: every started one (COMPLETE, PRUNED, FAIL, RUNNING)."""
    return len(study.get_trials(deepcopy=False, states=tuple(TrialState[s] for s in COUNTED_STATES)))


def load_worker_study(sweep: Sweep, sweep_dir: Path, worker_index: int, launch: int = 0):
    """The prepared study, with worker ``worker_index``'s sampler (seeded by
    :func:`harness.studies.sweep.study.sampler_seed`; ``launch``: trials started before this launch) and the pruner."""
    quiet_optuna()
    storage = make_storage(sweep.storage_url(sweep_dir))
    return optuna.load_study(
        study_name=sweep.name,
        storage=storage,
        sampler=make_sampler(sweep, worker_index, launch),
        pruner=make_pruner(sweep),
    )


def run_worker(
    sweep_dir: Path,
    worker_index: int = 0,
    export: bool = False,
    run: Callable[..., Any] | None = None,
    log: Callable[[str], None] = print,
    launch: int = 0,
) -> int:
    """Run trials from the sweep in ``sweep_dir`` until the budget (or the timeout) is used; returns how many this
    worker ran. ``export`` rewrites ``trials.parquet`` after each trial (the launcher does it otherwise);
    ``launch``: the trials started before this launch (it seeds the sampler)."""
    sweep_dir = Path(sweep_dir)
    sweep = load_resolved(sweep_dir)
    study = load_worker_study(sweep, sweep_dir, worker_index, launch)
    spec = sweep.spec.study
    deadline = time.monotonic() + spec.timeout if spec.timeout else None
    ran = 0
    while deadline is None or time.monotonic() < deadline:
        stale = fail_stale_trials(study, spec.heartbeat.grace)
        if stale:
            log(f"worker {worker_index}: failed stale trials {stale}")
        with budget_lock(sweep_dir, sweep.storage_url(sweep_dir), sweep.name):
            if counted_trials(study) >= spec.n_trials:
                break
            trial = study.ask()
        log(f"worker {worker_index}: trial {trial.number} started")
        state = run_trial(study, trial, sweep, sweep_dir, run=run)
        ran += 1
        frozen = study._storage.get_trial(trial._trial_id)
        log(
            f"worker {worker_index}: trial {trial.number} {state} values={frozen.values} "
            f"{frozen.user_attrs.get('fail_reason', '')}"
        )
        if export:
            write_trials(study, sweep, sweep_dir)
    return ran


# ----------------------------------------------------------------------------------------------------------------
# The launcher
# ----------------------------------------------------------------------------------------------------------------


def _describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def device_groups(gpus: list[str], workers: int) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` for each of ``workers`` workers: the devices dealt in equal consecutive groups
    (8 GPUs, 2 workers: ``0,1,2,3`` and ``4,5,6,7``), or shared round-robin when there are fewer devices than
    workers."""
    if not gpus:
        return []
    per = max(1, len(gpus) // workers)
    return [",".join(gpus[(i * per) % len(gpus) : (i * per) % len(gpus) + per]) for i in range(workers)]


def launch_workers(
    sweep: Sweep,
    sweep_dir: Path,
    workers: int,
    worker_offset: int = 0,
    echo: Callable[[str], None] = print,
    poll_s: float = 1.0,
    gpus: list[str] | None = None,
) -> dict[str, Any]:
    """Start ``workers`` worker processes on the prepared sweep in ``sweep_dir`` (each with its
    :func:`device_groups` share of ``gpus`` as ``CUDA_VISIBLE_DEVICES``), follow the study until they all exit
    (printing each finished trial, failing the trials of workers that die) and write ``trials.parquet``.
    Returns ``{"budget_done": bool, "exits": {pid: code}}``."""
    sweep_dir = Path(sweep_dir)
    log_dir = sweep_dir / "workers"
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = _start_worker_processes(sweep, sweep_dir, log_dir, workers, worker_offset, gpus)
    echo(
        f"{workers} worker{'s' if workers != 1 else ''} started (pids {', '.join(str(p.pid) for p in procs)}); "
        f"logs in {log_dir}"
    )
    study = load_worker_study(sweep, sweep_dir, worker_offset)
    exits = _follow_workers_to_the_end(procs, study, sweep, sweep_dir, echo, poll_s)
    done = counted_trials(study) >= sweep.spec.study.n_trials
    return {"budget_done": done, "exits": exits}


def _start_worker_processes(
    sweep: Sweep, sweep_dir: Path, log_dir: Path, workers: int, worker_offset: int, gpus: list[str] | None
) -> list[subprocess.Popen]:
    """Start workers ``worker_offset`` … ``worker_offset + workers - 1``, each logging to ``log_dir/<index>.log``,
    with the storage URL in its environment and its :func:`device_groups` share of ``gpus``."""
    procs: list[subprocess.Popen] = []
    # The storage URL itself (sweep.resolved.yaml keeps only its masked form, without the password).
    env = {**os.environ, "PYTHONUNBUFFERED": "1", STORAGE_ENV: sweep.storage_url(sweep_dir)}
    if "OMP_NUM_THREADS" not in env:  # workers share the cores instead of each taking all of them
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    devices = device_groups(gpus or [], workers)
    launch = counted_trials(load_worker_study(sweep, sweep_dir, worker_offset))  # once, before any worker starts
    for k, i in enumerate(range(worker_offset, worker_offset + workers)):
        worker_env = {**env, "CUDA_VISIBLE_DEVICES": devices[k]} if devices else env
        with open(log_dir / f"{i}.log", "ab") as out:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "harness.studies.sweep.worker",
                        str(sweep_dir),
                        "--index",
                        str(i),
                        "--launch",
                        str(launch),
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=worker_env,
                )
            )
    return procs


def _follow_workers_to_the_end(
    procs: list[subprocess.Popen], study, sweep: Sweep, sweep_dir: Path, echo: Callable[[str], None], poll_s: float
) -> dict[int, int]:
    """Poll the workers until they all exit, printing each finished trial and failing the trials of dead workers
    and of stale heartbeats; on Ctrl-C stop them. Whatever happens, the trials of ended workers are failed and
    ``trials.parquet`` is written. Returns ``{pid: exit code}``."""
    grace = sweep.spec.study.heartbeat.grace
    exits: dict[int, int] = {}
    follow = TrialFollower(study, sweep, sweep_dir, echo)
    try:
        while True:
            running = _note_worker_exits(procs, exits, study, echo)
            stale = fail_stale_trials(study, grace)
            if stale:
                echo(f"trials {stale} marked FAIL: no heartbeat for {grace:.0f} s")
            follow()
            if not running:
                break
            time.sleep(poll_s)
    except KeyboardInterrupt:
        echo("interrupted: stopping the workers (their running trials are marked FAIL)")
        _stop_workers(procs)
        raise
    finally:
        dead = {
            worker_id(p.pid): f"worker process {p.pid} ended ({_describe_exit(p.returncode)})"
            for p in procs
            if p.returncode is not None
        }
        fail_trials_of(study, dead)
        follow(write=False)
        write_trials(study, sweep, sweep_dir)
    return exits


def _note_worker_exits(
    procs: list[subprocess.Popen], exits: dict[int, int], study, echo: Callable[[str], None]
) -> bool:
    """Record in ``exits`` each worker that has newly exited, failing the trial of one that died; True while any
    worker still runs."""
    running = False
    for p in procs:
        code = p.poll()
        if code is None:
            running = True
        elif p.pid not in exits:
            exits[p.pid] = code
            if code != 0:
                why = f"worker process {p.pid} died ({_describe_exit(code)})"
                failed = fail_trials_of(study, {worker_id(p.pid): why})
                echo(why + (f"; its trial {', '.join(map(str, failed))} marked FAIL" if failed else ""))
    return running


def _stop_workers(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every worker still running and wait up to 30 s for each."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=30)


def run_sweep(
    sweep: Sweep,
    sweep_dir: Path,
    workers: int = 1,
    worker_offset: int = 0,
    echo: Callable[[str], None] = print,
    in_process: bool = False,
    run: Callable[..., Any] | None = None,
    gpus: list[str] | None = None,
) -> dict[str, Any]:
    """Prepare the study in ``sweep_dir`` and run it: ``workers`` processes (on ``gpus``, see
    :func:`device_groups`), or this process (``in_process``)."""
    prepare_study(sweep, sweep_dir)
    for note in sweep.notes:
        echo(f"note: {note}")
    warm_base_model(sweep, echo)
    if in_process:  # the URL reaches the worker as it reaches worker processes: through $HARNESS_STORAGE
        with mock.patch.dict(os.environ, {STORAGE_ENV: sweep.storage_url(sweep_dir)}):
            launch = counted_trials(load_worker_study(sweep, sweep_dir, worker_offset))
            run_worker(sweep_dir, worker_offset, export=True, run=run, log=echo, launch=launch)
        study = load_worker_study(sweep, sweep_dir, worker_offset)
        write_trials(study, sweep, sweep_dir)
        return {"budget_done": counted_trials(study) >= sweep.spec.study.n_trials, "exits": {}}
    return launch_workers(sweep, sweep_dir, workers, worker_offset, echo, gpus=gpus)


def warm_base_model(sweep: Sweep, echo: Callable[[str], None] = print) -> None:
    """Pretrain (or find cached) the base experiment's builtin model once, so workers do not all pretrain it."""
    exp = sweep.base
    if exp.model.hf or exp.model.pretrain is None:
        return
    # torch and transformers (seconds to import) only when there is a base model to pretrain; see run_trial.
    import transformers

    from harness.runs.planning.prepare import warm_base

    transformers.utils.logging.disable_progress_bar()
    started = time.perf_counter()
    info = warm_base(exp)
    if not info.cache_hit:
        echo(f"base model pretrained once for every worker ({time.perf_counter() - started:.0f} s, {info.cache_dir})")


def stop_on_sigterm() -> None:
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.studies.sweep.worker SWEEP_DIR --index I``: one worker process, as the launcher starts it."""
    parser = argparse.ArgumentParser(prog="python -m harness.studies.sweep.worker", description="One sweep worker.")
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument(
        "--index", type=int, default=0, help="Worker index (sampler seed = study.seed + index in a new sweep)."
    )
    parser.add_argument(
        "--launch",
        type=int,
        default=0,
        help="Trials started before this launch (a continued sweep's workers get fresh seeds).",
    )
    args = parser.parse_args(argv)
    stop_on_sigterm()
    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        run_worker(args.sweep_dir, args.index, log=lambda m: print(m, flush=True), launch=args.launch)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
