"""Designs made for fitting mixing laws: the ``sobol`` and ``dirichlet`` samplers of a sweep file
(``study.sampler``). TPE is an optimiser and crowds its trials where it believes the optimum is; a law is fitted
and tested best on mixtures spread over the region it will predict. Both samplers are deterministic per trial
number — trial k gets the same parameters whichever worker, machine or order draws it — because they read only the
study seed and the trial's number, never the study's history.

- ``sobol``: a scrambled Sobol sequence (``scipy.stats.qmc.Sobol``, Owen scrambling seeded by the study seed),
  point k for trial k. A simplex of k tasks takes k − 1 coordinates and maps them to the simplex by sorted uniform
  spacings (the sorted coordinates cut [0, 1] into k pieces; Fang & Wang 1994, Pillards & Cools 2005 transform a
  low-discrepancy sequence to the simplex this way); every other parameter takes one coordinate, mapped through
  its distribution (log, step and choices respected). optuna's ``QMCSampler`` is not used: it samples a study's
  first trial at random, and numbers its points by a study-wide counter that workers race for, so trial k's point
  depends on the order trials were asked in.
- ``dirichlet``: RegMix's design (Liu et al. 2024): each simplex drawn from a Dirichlet around the stage's base
  mixture (its weights, pool sizes for ``natural``, counts for ``counts``; mixed 90/10 with uniform so that every
  task can be drawn), at concentrations cycled over the trials (``sampler_args: {concentrations: [...]}``, default
  0.5, 1, 2, 4; α = concentration × k × prior, so 1 around a uniform base is the uniform distribution on the
  simplex and larger values stay nearer the base). Other parameters are drawn uniformly from a generator seeded by
  the study seed and the trial number.

The simplex weights reach :func:`~harness.studies.sweep.space.sample_values` as its ``u`` parameters:
``u_t = exp(−w_t)``, which its ``−log u`` normalisation maps back to exactly ``w``.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from scipy.stats import qmc

DESIGNS = ("sobol", "dirichlet")
DEFAULT_CONCENTRATIONS = (0.5, 1.0, 2.0, 4.0)
BASE_SHARE = 0.9  # the base mixture's share of the Dirichlet prior; the rest is uniform


def spacings(cube: np.ndarray) -> np.ndarray:
    """Points of the unit cube (rows, k − 1 coordinates) to the k-simplex by sorted uniform spacings."""
    cut = np.sort(np.atleast_2d(cube), axis=1)
    edges = np.hstack([np.zeros((len(cut), 1)), cut, np.ones((len(cut), 1))])
    return np.diff(edges, axis=1)


def from_unit(distribution: BaseDistribution, u: float) -> Any:
    """A coordinate in [0, 1) as a value of an optuna distribution (the inverse of a uniform draw from it)."""
    u = min(max(float(u), 0.0), 1.0 - 1e-12)
    if isinstance(distribution, CategoricalDistribution):
        return distribution.choices[int(u * len(distribution.choices))]
    low, high = float(distribution.low), float(distribution.high)
    step = getattr(distribution, "step", None)
    if distribution.log:
        value = math.exp(math.log(low) + u * (math.log(high) - math.log(low)))
    elif step:
        value = low + math.floor(u * (math.floor((high - low) / step) + 1)) * step
    else:
        value = low + u * (high - low)
    value = min(max(value, low), high)
    return int(round(value)) if isinstance(distribution, IntDistribution) else value


class SimplexDesignSampler(optuna.samplers.BaseSampler):
    """A space-filling design as an optuna sampler (see the module docstring). ``simplexes``: ``[(optuna names
    of a simplex's u, base mixture over its tasks)]``; ``others``: every other parameter's optuna name."""

    def __init__(
        self,
        design: str,
        simplexes: Sequence[tuple[list[str], Sequence[float]]],
        others: Sequence[str],
        seed: int,
        concentrations: Sequence[float] | None = None,
    ):
        if design not in DESIGNS:
            raise ValueError(f"unknown design {design!r}: one of {', '.join(DESIGNS)}")
        if concentrations is not None and (
            not len(concentrations) or any(not (c > 0 and math.isfinite(c)) for c in concentrations)
        ):
            raise ValueError("concentrations: a list of positive numbers")
        if design == "sobol" and concentrations is not None:
            raise ValueError("concentrations apply to the dirichlet design only")
        self.design, self.seed = design, int(seed)
        self.simplexes = [(list(names), np.asarray(base, dtype=float)) for names, base in simplexes]
        self.others = list(others)
        self.concentrations = list(concentrations or DEFAULT_CONCENTRATIONS)
        self._points: dict[int, dict[str, float]] = {}

    # The design draws every parameter independently of the study's history.
    def infer_relative_search_space(self, study, trial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study, trial, search_space) -> dict[str, Any]:
        return {}

    def sample_independent(self, study, trial, param_name: str, distribution: BaseDistribution) -> Any:
        point = self.point(trial.number)
        if param_name not in point:  # a parameter the sweep did not declare: still a function of the number
            rng = np.random.default_rng([self.seed, trial.number, zlib.crc32(param_name.encode())])
            return from_unit(distribution, rng.random())
        if param_name.endswith(":u") and isinstance(distribution, FloatDistribution):
            return point[param_name]  # a simplex weight's u, already in [e^-1, 1]
        return from_unit(distribution, point[param_name])

    def point(self, number: int) -> dict[str, float]:
        """Trial ``number``'s design point: each simplex's ``u`` (``exp(−w)``) and every other parameter's
        coordinate in [0, 1)."""
        if number not in self._points:
            self._points[number] = self._sobol(number) if self.design == "sobol" else self._dirichlet(number)
        return self._points[number]

    def mixtures(self, number: int) -> list[np.ndarray]:
        """Trial ``number``'s mixture on each simplex (what the ``u`` of :meth:`point` map back to)."""
        point = self.point(number)
        return [-np.log([point[n] for n in names]) for names, _ in self.simplexes]

    def _sobol(self, number: int) -> dict[str, float]:
        dims = sum(len(names) - 1 for names, _ in self.simplexes) + len(self.others)
        engine = qmc.Sobol(d=max(dims, 1), scramble=True, seed=self.seed)
        if number:
            engine.fast_forward(number)
        x = engine.random(1)[0]
        out, at = {}, 0
        for names, _ in self.simplexes:
            w = spacings(x[at : at + len(names) - 1])[0]
            at += len(names) - 1
            out |= {n: math.exp(-float(wt)) for n, wt in zip(names, w)}
        return out | {n: float(x[at + i]) for i, n in enumerate(self.others)}

    def _dirichlet(self, number: int) -> dict[str, float]:
        rng = np.random.default_rng([self.seed, number])
        concentration = self.concentrations[number % len(self.concentrations)]
        out = {}
        for names, base in self.simplexes:
            k = len(names)
            prior = BASE_SHARE * base / base.sum() + (1 - BASE_SHARE) / k if base.sum() > 0 else np.full(k, 1 / k)
            w = rng.dirichlet(concentration * k * prior)
            out |= {n: math.exp(-float(wt)) for n, wt in zip(names, w)}
        return out | {n: float(rng.random()) for n in self.others}


def base_mixture(sweep, param) -> list[float]:
    """The base experiment's mixture at a simplex parameter's stage, over the simplex's tasks (zeros where the
    stage has none of them, or the path is not a stage's mixture)."""
    parts = param.parts
    tasks = list(param.spec.simplex)
    if len(parts) < 2 or parts[0] != "stages" or not isinstance(parts[1], int):
        return [0.0] * len(tasks)
    mixture = sweep.base.resolved_stages()[parts[1]].mixture
    if mixture.kind == "natural":
        return [float(sweep.base.tasks[t].train) if t in mixture.weights else 0.0 for t in tasks]
    source = mixture.counts if mixture.kind == "counts" else mixture.weights
    return [float(source.get(t, 0.0)) for t in tasks]


def design_sampler(sweep, seed: int, args: dict[str, Any]) -> SimplexDesignSampler:
    """The sweep's ``sobol`` / ``dirichlet`` sampler, seeded by the study seed (not the worker's: every worker
    must give trial k the same point)."""
    simplexes = [(p.optuna_names(), base_mixture(sweep, p)) for p in sweep.params if p.kind == "simplex"]
    others = [n for p in sweep.params if p.kind != "simplex" for n in p.optuna_names()]
    return SimplexDesignSampler(sweep.spec.study.sampler, simplexes, others, seed, **args)
