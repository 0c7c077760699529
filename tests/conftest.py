"""Shared fixtures: an isolated model cache, tiny experiments, and one micro run shared by the tests that read it."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Every test process uses its own model cache, so tests never see a developer's cache (or each other's)."""
    cache = tmp_path_factory.mktemp("harness-cache")
    old = os.environ.get("HARNESS_CACHE")
    os.environ["HARNESS_CACHE"] = str(cache)
    os.environ["WANDB_SILENT"] = "true"
    yield cache
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
    """``python -m harness ARGS`` in a subprocess (the real exit code and output)."""
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


# The data-parallel tests (tests/runs/test_distributed.py, tests/runs/test_fsdp.py) compare ranks with one process on
# the micro experiment: single-threaded (torchrun gives each rank one thread; the comparison is about the data-parallel
# arithmetic, not thread-count-dependent summation order), a training-metrics row every step, wandb off.
PARALLEL_ENV = {"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
# Padded batches: the one-process vs two-rank bounds were measured on them; on packed batches (another float order,
# amplified chaotically from stage 2 on: up to 1.3e-4) the first stage agrees to 2e-7 —
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
