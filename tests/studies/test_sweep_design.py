"""The space-filling designs of a sweep (``study.sampler: sobol | dirichlet``): the mixtures cover the simplex better
than random draws, the Dirichlet design's concentrations tighten around the base mixture, and trial k gets the
same parameters whichever worker draws it and in whatever order."""

from __future__ import annotations

import numpy as np
import optuna
import pytest

from harness.config import ConfigError
from harness.studies.sweep import load_sweep, make_sampler, sample_values
from harness.studies.sweep.design import SimplexDesignSampler, spacings
from tests.studies.test_sweep import _sweep

TASKS = ["a", "b", "c", "d"]


def _names(tasks=TASKS):
    return [f"stages.s.mixture.{t}:u" for t in tasks]


def _nearest_gap(design: np.ndarray, reference: np.ndarray) -> float:
    """The mean distance from reference points of the simplex to their nearest design point (smaller: the design
    leaves fewer holes)."""
    d = np.sqrt(((reference[:, None, :] - design[None, :, :]) ** 2).sum(axis=-1))
    return float(d.min(axis=1).mean())


def test_spacings_map_the_cube_onto_the_simplex():
    w = spacings(np.random.default_rng(0).random((100, 3)))
    assert w.shape == (100, 4) and (w >= 0).all() and np.allclose(w.sum(axis=1), 1.0)


def test_sobol_design_covers_the_simplex_better_than_random_draws():
    sampler = SimplexDesignSampler("sobol", [(_names(), [1, 1, 1, 1])], [], seed=0)
    design = np.array([sampler.mixtures(k)[0] for k in range(64)])
    assert np.allclose(design.sum(axis=1), 1.0) and (design >= 0).all()
    reference = np.random.default_rng(99).dirichlet(np.ones(4), 3000)
    sobol_gap = _nearest_gap(design, reference)
    random_gaps = [_nearest_gap(np.random.default_rng(s).dirichlet(np.ones(4), 64), reference) for s in range(20)]
    # a space-filling design leaves smaller holes than every one of 20 random designs of the same size
    assert sobol_gap < min(random_gaps), (sobol_gap, sorted(random_gaps)[:3])


def test_dirichlet_design_tightens_around_the_base_mixture_as_concentration_grows():
    base = np.array([0.55, 0.25, 0.15, 0.05])
    sampler = SimplexDesignSampler("dirichlet", [(_names(), base)], [], seed=1, concentrations=[0.5, 8.0])
    loose = np.array([sampler.mixtures(k)[0] for k in range(0, 200, 2)])  # concentration 0.5
    tight = np.array([sampler.mixtures(k)[0] for k in range(1, 200, 2)])  # concentration 8
    distance = lambda m: np.abs(m - base).sum(axis=1).mean()  # noqa: E731
    assert distance(tight) < 0.5 * distance(loose)
    assert np.abs(tight.mean(axis=0) - (0.9 * base + 0.025)).max() < 0.03  # centred on the prior
    with pytest.raises(ValueError, match="concentrations"):
        SimplexDesignSampler("sobol", [(_names(), base)], [], seed=1, concentrations=[1.0])


@pytest.mark.parametrize("design", ["sobol", "dirichlet"])
def test_trial_k_gets_the_same_parameters_on_every_worker_and_in_any_order(tmp_path, design):
    space = {
        "stages.b.mixture": {"simplex": ["repeat", "yesno", "math"]},
        "train.optim.lr": {"float": [1e-4, 1e-2], "log": True},
    }
    sweep = load_sweep(_sweep(tmp_path, "design", study={"sampler": design, "seed": 3}, space=space))

    def draw(samplers: list, n: int) -> dict[int, dict]:
        """n trials of one study, asked in turn by workers with these samplers (one storage)."""
        storage = optuna.storages.InMemoryStorage()
        studies = [
            optuna.create_study(storage=storage, study_name="s", sampler=s, load_if_exists=True) for s in samplers
        ]
        out = {}
        for i in range(n):
            trial = studies[i % len(studies)].ask()
            out[trial.number] = sample_values(trial, sweep)
        return out

    alone = draw([make_sampler(sweep, 0)], 6)
    shared = draw([make_sampler(sweep, 1), make_sampler(sweep, 0, launch=5), make_sampler(sweep, 2)], 6)
    assert shared == alone
    weights = [alone[k]["stages.b.mixture"] for k in range(6)]
    assert all(abs(sum(w.values()) - 1.0) < 1e-9 for w in weights) and len({tuple(w.values()) for w in weights}) == 6
    later = make_sampler(sweep, 0)  # a fresh sampler asked for trial 5 before any other gives trial 5's point
    assert later.mixtures(5)[0] == pytest.approx(list(weights[5].values()))


def test_sampler_args_of_a_design_are_checked_in_the_sweep_file(tmp_path):
    with pytest.raises(ConfigError, match="concentrations"):
        load_sweep(_sweep(tmp_path, "bad", study={"sampler": "dirichlet", "sampler_args": {"concentrations": [0]}}))
