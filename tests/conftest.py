"""Shared fixtures: an isolated model cache, tiny experiments, and one micro run shared by the tests that read it."""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.cli_process import fresh_process, harness_process, needs_fresh_interpreter, start_with, stop_forkserver

ROOT = Path(__file__).resolve().parents[1]
MICRO = ROOT / "tests" / "data" / "micro.yaml"

# A tiny experiment that trains in seconds: used wherever a test needs a run but not the micro config's numbers.
TINY = {
    "name": "tiny",
    "seed": 3,
    "world": {"people": 40, "seed": 3},
    "model": {
        "builtin": "qwen2-tiny",
        "config": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
        },
        "tokenizer": {"vocab_size": 400},
        "pretrain": {"steps": 4, "batch_size": 4, "seq_len": 32},
    },
    "tasks": {
        "repeat": {"recipe": "repeat", "train": 40, "eval": 4},
        "yesno": {"recipe": "yesno", "train": 40, "eval": 4},
        "math": {"recipe": "math_reversed", "train": 40, "eval": 4, "params": {"digits": 2}},
    },
    "train": {"batch_size": 4, "optim": {"lr": 3e-3, "warmup": 1}, "log_every": 2},
    "eval": {"every": 4, "splits": ["heldout"]},  # max_new_tokens: auto (what the gold answers need)
    "stages": [
        {"name": "a", "steps": 4, "mixture": {"repeat": 1.0}},
        {"name": "b", "steps": 4, "mixture": {"repeat": 0.5, "yesno": 0.5}},
    ],
    "tracking": {"wandb": {"mode": "disabled"}, "console": False},
}


# ---------------------------------------------------------------------------------------------------------------------
# Parallel runs (``make test``: ``pytest -n auto``, pytest-xdist). One worker per core at one torch thread each: the
# suite's time is mostly one-core work (processes that start and import transformers, small models), which a second
# worker overlaps. ``OMP_NUM_THREADS=k`` asks for k threads per worker and gets cores // k workers, and one worker
# means the suite runs in this process as before: on two cores ``OMP_NUM_THREADS=1 make test`` (two workers) and
# ``OMP_NUM_THREADS=2 make test`` (serial) run the suite at both summation orders.
# Each module goes to one worker whole (its module-scoped fixtures are made once), and modules that read the same
# session-scoped run go together (that run is made once). The longest go first, so the workers finish together.
# ---------------------------------------------------------------------------------------------------------------------
SHARED_RUN_GROUPS = {
    "micro_one_process": ["runs/test_distributed.py", "runs/test_fsdp.py"],
    "micro_run": ["cli/test_cli_faults.py", "evaluation/test_evidence_run.py", "runs/test_run.py",
                  "runs/test_trainable_runs.py"],
}  # fmt: skip
_GROUP_OF_MODULE = {f"tests/{m}": group for group, modules in SHARED_RUN_GROUPS.items() for m in modules}
# The longest work units of the last measured run (about a minute each or more), in the order they should start.
LONGEST_FIRST = [
    "micro_one_process",
    "micro_run",
    "tests/studies/test_sweep_faults.py",
    "tests/runs/test_resilience.py",
    "tests/studies/test_sweep.py",
    "tests/evaluation/test_benchmarks.py",
    "tests/data/test_steering.py",
]


def _work_unit(nodeid: str) -> str:
    module = nodeid.split("::")[0]
    return _GROUP_OF_MODULE.get(module, module)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: cores // OMP_NUM_THREADS workers (unset or not a number: one thread each), or
    PYTEST_XDIST_AUTO_NUM_WORKERS; 0 (no workers) when that is one."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").isdigit():
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    threads = os.environ.get("OMP_NUM_THREADS", "")
    workers = _cores() // max(int(threads) if threads.isdigit() else 1, 1)
    return workers if workers > 1 else 0


def pytest_configure(config) -> None:
    """With workers, each runs one torch thread unless OMP_NUM_THREADS says otherwise (set before they start, so
    their torch and every process they start inherit it)."""
    if getattr(config.option, "numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's module-by-module scheduling, with the work units above (``_work_unit``) in collection order; only
    for ``-n`` without a ``--dist`` of the caller's choosing."""
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedRunScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    config.option.loadscopereorder = False  # keep the order pytest_collection_modifyitems gives
    return SharedRunScheduling(config, log)


def pytest_collection_modifyitems(config, items) -> None:
    """On an xdist worker (only workers collect), the longest work units first: a stable sort, so every worker
    collects the same order, as xdist requires."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(_work_unit(item.nodeid), len(rank)))


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Every test process uses its own model cache, so tests never see a developer's cache (or each other's)."""
    cache = tmp_path_factory.mktemp("harness-cache")
    old = os.environ.get("HARNESS_CACHE")
    os.environ["HARNESS_CACHE"] = str(cache)
    os.environ["WANDB_SILENT"] = "true"
    start_with(os.environ)  # the environment run_cli's forkserver starts with, whichever test calls it first
    yield cache
    stop_forkserver()
    if old is None:
        os.environ.pop("HARNESS_CACHE", None)
    else:
        os.environ["HARNESS_CACHE"] = old


@pytest.fixture
def tiny() -> dict:
    """A fresh copy of the tiny experiment as a dict, to modify per test."""
    return copy.deepcopy(TINY)


@pytest.fixture
def auto_compiles(monkeypatch):
    """``train.compile: auto`` compiles every stage here (short ones too, whatever compiler this machine has)."""
    from harness.training import compiling

    monkeypatch.setattr(compiling, "AUTO_COMPILE_MIN_STEPS", 1)
    monkeypatch.setattr(compiling, "can_compile", lambda device_type: True)


def invoke(*args: str):
    """``harness ARGS`` in this process (typer's runner: ``exit_code``, ``stdout``, ``stderr``): for commands that
    stop before any work (validation, refusals), without a subprocess's start-up."""
    from typer.testing import CliRunner

    from harness.cli.app import app

    return CliRunner().invoke(app, list(args))


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_cli(*args: str, cwd: Path = ROOT, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m harness ARGS`` in a process of its own (the real exit code and output): forked from one that has
    imported torch and transformers once (:mod:`tests.cli_process`), or a fresh interpreter where ``env`` changes
    what only start-up reads."""
    full_env = {**os.environ, **(env or {})}
    start = fresh_process if needs_fresh_interpreter(full_env) else harness_process
    return start(list(args), cwd, full_env, timeout)


# The data-parallel tests (tests/runs/test_distributed.py, tests/runs/test_fsdp.py) compare ranks with one process on
# the micro experiment: single-threaded (torchrun gives each rank one thread; the comparison is about the data-parallel
# arithmetic, not thread-count-dependent summation order), a training-metrics row every step, wandb off.
PARALLEL_ENV = {"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
# Padded batches, whose rows the reference run reverses (rows_reversed_run, below); packed batches on two ranks:
# tests/training/test_packing.py::test_two_ranks_train_packed_batches_like_one_process.
PARALLEL_SETTINGS = [
    "--set",
    "train.log_every=1",
    "--set",
    "tracking.wandb.mode=disabled",
    "--set",
    "train.packing=false",
]
# Resume points at every evaluation (eval.every is 20), all kept: the weights behind each evaluation's predictions.
EVERY_EVAL_WEIGHTS = ["--set", "train.checkpoint_every=20", "--set", "train.keep_checkpoints=10"]


@pytest.fixture(scope="session")
def micro_one_process(tmp_path_factory) -> Path:
    """One process on the micro experiment as the data-parallel tests compare it (above), with the weights of
    every evaluation kept and without the stage cache (it must train); shared by both test files, run once."""
    out = tmp_path_factory.mktemp("one_process") / "one"
    result = run_cli(
        "run",
        str(MICRO),
        "--out",
        str(out),
        *PARALLEL_SETTINGS,
        *EVERY_EVAL_WEIGHTS,
        "--set",
        "train.stage_cache=false",
        env=PARALLEL_ENV,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return out


@pytest.fixture(scope="session")
def micro_run(tmp_path_factory) -> Path:
    """``harness run tests/data/micro.yaml --out D`` exactly as written, once per session; returns D."""
    out = tmp_path_factory.mktemp("micro") / "run"
    result = run_cli("run", str(MICRO), "--out", str(out))
    assert result.returncode == 0, result.stderr[-4000:]
    (out / "console.txt").write_text(result.stdout + result.stderr)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Cross-configuration tolerances. Two configurations that compute the same thing (one process and two ranks, FSDP, ...)
# add the same float terms in another order; on another CPU (AMD and Intel kernels, 1 or 2 threads) those orders and
# their rounding differ, and over a run the ulps grow chaotically. So no bound is a constant measured once: each is
# DRIFT_FACTOR × how far the same one-process run drifts when only its summation order changes (its batches' rows
# reversed, :func:`rows_reversed_run`), measured in the same test on the same CPU, and never below a float32
# rounding floor (where the reordered run happens to round alike, e.g. the first step's loss).
# ---------------------------------------------------------------------------------------------------------------------
# The factor covers how differently chaotic growth treats two orders (the data-parallel runs' ratios to the reversed
# run, per stage and metric: docs/distributed.md) and stays below what a real fault gives: a wrong averaging over ranks
# is off by ≥ 0.29 relative in the grad norm, and any fault is caught in the first stage, where the bound is ~1e-5.
DRIFT_FACTOR = 30.0
ROUNDING_FLOOR = 2 * float(np.finfo(np.float32).eps)  # relative: two float32 ulps


def drift_bound(reference_rel) -> float:
    """The largest relative difference another summation order may give: ``DRIFT_FACTOR`` × the reordered run's
    largest one (``reference_rel``: its relative differences from the run compared against), floored."""
    return DRIFT_FACTOR * max(float(np.max(reference_rel)), ROUNDING_FLOOR)


def rows_reversed_run(config: Path, out: Path, overrides: list[str]) -> Path:
    """``harness run CONFIG --out OUT`` with ``overrides`` (``key=value``), in this process, single-threaded, with the
    rows of every training batch collated in reverse order: the same examples and the same token-mean loss, summed in
    another order (the weight gradients' sums over tokens, the loss's sum). Evaluation batches are untouched."""
    import torch

    from harness.config.load import load_experiment
    from harness.data import batches, images
    from harness.runs.execution.runner import run_experiment

    def reversed_rows(examples, pad_id):
        return batches.collate(list(examples)[::-1], pad_id)

    threads, original = torch.get_num_threads(), images.collate
    torch.set_num_threads(1)  # as PARALLEL_ENV's runs: only the row order differs
    images.collate = reversed_rows  # what a stage's collator (harness.data.images.stage_collator) binds
    try:
        run_experiment(load_experiment(config, overrides), out)
    finally:
        images.collate = original
        torch.set_num_threads(threads)
    return out


def _overrides(settings: list[str]) -> list[str]:
    return [s for s in settings if s != "--set"]


@pytest.fixture(scope="session")
def micro_rows_reversed(tmp_path_factory, micro_one_process) -> Path:
    """:func:`micro_one_process` again with every training batch's rows reversed (:func:`rows_reversed_run`): how far
    rounding alone takes the micro run on this CPU, the reference of the data-parallel tests' tolerances. After
    ``micro_one_process``, whose pretrained base it reuses from the cache."""
    out = tmp_path_factory.mktemp("rows_reversed") / "reversed"
    settings = [*PARALLEL_SETTINGS, *EVERY_EVAL_WEIGHTS, "--set", "train.stage_cache=false"]
    return rows_reversed_run(MICRO, out, _overrides(settings))


def proportion_outcomes(sample: dict) -> dict:
    """A ``samples.jsonl`` line with its ``outcomes`` cut to the 0/1 ones (proportion metrics): what two runs that
    differ by summation order alone must agree on exactly, away from near ties. The continuous per-item outcomes
    (``eval_loss``, ``gold_logprob``) move with rounding: :func:`continuous_outcome_differences`."""
    from harness.core.metrics import PROPORTION_METRICS

    outcomes = {k: v for k, v in sample.get("outcomes", {}).items() if k in PROPORTION_METRICS}
    return {**sample, "outcomes": outcomes}


def continuous_outcome_differences(rows_a: list[dict], rows_b: list[dict]) -> dict[str, float]:
    """Per continuous per-item outcome (``eval_loss``, ``gold_logprob``…), its largest absolute difference between
    two runs' ``samples.jsonl`` lines, taken in the same order."""
    from harness.core.metrics import PROPORTION_METRICS

    largest: dict[str, float] = {}
    for a, b in zip(rows_a, rows_b, strict=True):
        for name, value in a.get("outcomes", {}).items():
            if name not in PROPORTION_METRICS:
                largest[name] = max(largest.get(name, 0.0), abs(value - b["outcomes"][name]))
    return largest


def relative(a, b) -> np.ndarray:
    """|a − b| / |a|, elementwise."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    assert a.shape == b.shape
    return np.abs(a - b) / np.abs(a)


def assert_drift_like_reordering(rel, reference_rel, stages: list[tuple[int, int]], what: str) -> None:
    """Per stage (``stages``: row ranges), the largest relative difference ``rel`` within :func:`drift_bound` of the
    reordered run's in the same stage (rounding grows from stage to stage, so each stage is held to its own)."""
    for start, end in stages:
        got, bound = float(np.max(rel[start:end])), drift_bound(reference_rel[start:end])
        assert got <= bound, (
            f"{what}, rows {start}-{end}: differs by up to {got:.2e} (relative), more than {DRIFT_FACTOR:g} × the "
            f"{float(np.max(reference_rel[start:end])):.2e} another summation order gives (bound {bound:.2e})"
        )


def eval_rel(base, other, metric="eval_loss"):
    """Per evaluation (stage, step, task, split), ``other``'s relative difference from ``base`` on ``metric``."""
    import polars as pl

    key = ["stage", "step", "task", "split"]
    a, b = (
        df.filter(pl.col("metric") == metric, pl.col("text").is_null()).select(key + ["value"]) for df in (base, other)
    )
    joined = a.join(b, on=key, how="full", suffix="_2", nulls_equal=True).sort("step", "stage", "task", "split")
    assert joined.height == a.height == b.height > 0
    return joined.with_columns(((pl.col("value") - pl.col("value_2")).abs() / pl.col("value").abs()).alias("rel"))


def assert_eval_drift_like_reordering(base, other, reordered, metric: str) -> None:
    """Every evaluation's ``metric`` in ``other`` within :func:`drift_bound` of ``base``, stage by stage, from how far
    the ``reordered`` run's evaluations at the same steps are from ``base``'s."""
    import polars as pl

    rel, reference = eval_rel(base, other, metric), eval_rel(base, reordered, metric)
    keys = ["stage", "step", "task", "split"]
    assert rel.select(keys).equals(reference.select(keys))  # the same evaluations
    for stage in rel["stage"].unique(maintain_order=True):
        got, ref = (f.filter(pl.col("stage") == stage)["rel"].to_numpy() for f in (rel, reference))
        assert got.max() <= drift_bound(ref), (
            f"{metric} in stage {stage}: differs by up to {got.max():.2e} (relative), another summation order by "
            f"{ref.max():.2e} (bound {drift_bound(ref):.2e})"
        )
