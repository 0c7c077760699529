"""Every shipped experiment and sweep file loads and validates (as torchtune validates every shipped recipe config).

Which is which is read from the file: a sweep file has a top-level ``space`` (required by the sweep schema, unknown
to the experiment schema); an experiment file has a top-level ``stages``. Sweeps go through
:func:`harness.studies.sweep.load_sweep`, which also loads and validates the sweep's base experiment (its path relative
to the sweep file, the sweep's overrides applied) and checks the space and objectives against it. The experiment files
under ``tests/data`` are validated too.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import yaml

from harness.config import Experiment, load_experiment
from harness.studies.repro.plan import arm_experiment, load_repro
from harness.studies.sweep import Sweep, load_sweep
from tests.conftest import ROOT

SWEEP_KEY = "space"
EXPERIMENT_KEY = "stages"
REPRO_KEY = "arms"  # experiments/repro/NAME/repro.yaml (harness.studies.repro.plan)


def config_kind(path: Path) -> str | None:
    """``sweep``, ``experiment``, ``repro``, or None for a YAML file that is none of them."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        return None
    if SWEEP_KEY in data:
        return "sweep"
    if EXPERIMENT_KEY in data:
        return "experiment"
    if REPRO_KEY in data:
        return "repro"
    return None


def yaml_files(root: Path, pattern: str) -> list[Path]:
    return sorted(p for p in root.glob(pattern) if p.suffix in (".yaml", ".yml") and p.is_file())


SHIPPED = {path: config_kind(path) for path in yaml_files(ROOT / "experiments", "**/*")}
TEST_DATA = {path: config_kind(path) for path in yaml_files(ROOT / "tests" / "data", "*")}
EXPERIMENTS = [p for p, kind in SHIPPED.items() if kind == "experiment"]
TEST_DATA_EXPERIMENTS = [p for p, kind in TEST_DATA.items() if kind == "experiment"]
SWEEPS = [p for p, kind in SHIPPED.items() if kind == "sweep"]
REPROS = [p for p, kind in SHIPPED.items() if kind == "repro"]


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_shipped_files_are_found_and_recognised():
    """The parametrised tests below cannot pass by finding nothing, and no shipped YAML escapes them."""
    assert EXPERIMENTS, "no experiment file found under experiments/"
    assert SWEEPS, "no sweep file found under experiments/"
    assert TEST_DATA_EXPERIMENTS, "no experiment file found under tests/data/"
    unknown = [relative(p) for p, kind in SHIPPED.items() if kind is None]
    assert not unknown, (
        f"neither an experiment (top-level {EXPERIMENT_KEY}:), a sweep (top-level {SWEEP_KEY}:) nor "
        f"a reproduction (top-level {REPRO_KEY}:): {', '.join(unknown)}"
    )


@pytest.mark.parametrize("path", EXPERIMENTS + TEST_DATA_EXPERIMENTS, ids=relative)
def test_experiment_file_loads_and_validates(path: Path):
    experiment = load_experiment(path)
    assert isinstance(experiment, Experiment)
    assert experiment.resolved_stages()
    assert pickle.loads(pickle.dumps(experiment)) == experiment  # what `repro --jobs` sends to its processes


@pytest.mark.parametrize("path", SWEEPS, ids=relative)
def test_sweep_file_loads_and_validates(path: Path):
    sweep = load_sweep(path)
    assert isinstance(sweep, Sweep)
    assert isinstance(sweep.base, Experiment)
    assert sweep.params and sweep.objectives


@pytest.mark.parametrize("path", REPROS, ids=relative)
def test_repro_file_loads_and_every_arm_validates(path: Path):
    repro = load_repro(path.parent)
    for arm in repro.spec.arms:
        experiment = arm_experiment(repro, arm, seed=0)
        assert isinstance(experiment, Experiment)
        # `harness repro --jobs` pickles each arm's experiment to a spawned process (a stage's optim override
        # once failed to pickle there)
        assert pickle.loads(pickle.dumps(experiment)) == experiment, arm
