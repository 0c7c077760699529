"""Loss targets as sweep objectives and law targets (issue 52, item 1): ``eval_loss`` and ``gold_logprob`` of a task
and split — the greedy pool's or the loss pool's (``loss_<split>``) — with their direction read from the metric
registry."""

from __future__ import annotations

import copy

import numpy as np
import polars as pl
import pytest

from analysis.frames import lower_is_better
from analysis.mixture_data import sweep_law_data
from harness.config import ConfigError
from harness.core.metrics import METRICS, declare_metric
from harness.studies.sweep import load_sweep
from tests.conftest import TINY, write_yaml


def _sweep(tmp_path, objective, loss_items=24):
    exp = copy.deepcopy(TINY)
    if loss_items:
        exp["eval"]["loss_items"] = loss_items
    write_yaml(tmp_path / "tiny.yaml", exp)
    return write_yaml(
        tmp_path / "s.yaml",
        {
            "experiment": "tiny.yaml",
            "space": {"stages.b.mixture": {"simplex": ["repeat", "yesno", "math"]}},
            "objective": objective,
        },
    )


@pytest.mark.parametrize(("metric", "direction"), [("eval_loss", "minimize"), ("gold_logprob", "maximize")])
def test_a_loss_pool_objective_is_accepted_with_the_registry_s_direction(tmp_path, metric, direction):
    sweep = load_sweep(_sweep(tmp_path, {"metric": metric, "split": "loss_heldout", "tasks": ["math"]}))
    assert sweep.directions == [direction]
    assert METRICS.get(metric).higher_is_better is (direction == "maximize")


def test_a_loss_pool_objective_needs_the_pool_and_a_loss_target(tmp_path):
    with pytest.raises(ConfigError, match="no eval.loss_items"):
        load_sweep(_sweep(tmp_path, {"metric": "eval_loss", "split": "loss_heldout"}, loss_items=None))
    with pytest.raises(ConfigError, match="has eval_loss and gold_logprob only"):
        load_sweep(_sweep(tmp_path, {"metric": "greedy", "split": "loss_heldout"}))


def test_a_plug_in_s_declared_direction_reaches_the_analysis():
    """No hard-coded list: a metric declared lower-is-better is minimised by the analysis too."""
    declare_metric("my_perplexity", higher_is_better=False)
    assert lower_is_better("my_perplexity") and lower_is_better("metric/b/loss_heldout/math/eval_loss")
    assert not lower_is_better("gold_logprob")


def _trials(rng, n=12):
    w = rng.dirichlet(np.ones(3), n)
    data = {"number": list(range(n)), "state": ["COMPLETE"] * n, "objective": [0.0] * n}
    for j, task in enumerate(("repeat", "yesno", "math")):
        data[f"param/stages.b.mixture.{task}"] = w[:, j]
        loss = 2.0 - w[:, j] + rng.normal(0, 0.01, n)
        data[f"metric/b/loss_heldout/{task}/eval_loss"] = loss
        data[f"metric/b/loss_heldout/{task}/gold_logprob"] = -3 * loss
        data[f"metric/b/heldout/{task}/greedy"] = 1 - loss / 2
    return pl.DataFrame(data)


@pytest.mark.parametrize(("metric", "maximize"), [("eval_loss", False), ("gold_logprob", True), ("greedy", True)])
def test_the_law_fits_loss_targets_of_the_loss_pool_in_their_direction(metric, maximize):
    split = "heldout" if metric == "greedy" else "loss_heldout"
    trials = _trials(np.random.default_rng(0))
    config = {
        "objective": {"metric": metric, "split": split, "reduce": "mean"},
        "space": {"stages.b.mixture": {"simplex": ["repeat", "yesno", "math"]}},
    }
    trials = trials.with_columns(pl.lit(None, dtype=pl.Float64).alias("objective"))  # reduced from the targets
    law = sweep_law_data(trials, config)
    assert law.maximize is maximize and law.split == split and law.targets == ["repeat", "yesno", "math"]
    assert law.proportion == [metric == "greedy"] * 3  # a loss is fitted on its own scale, not through a logit
    column = f"metric/b/{split}/math/{metric}"
    assert np.allclose(law.Y[:, 2], trials[column].to_numpy())


class _Trial:
    def __init__(self):
        self.reported: list[tuple[float, int]] = []

    def report(self, value, step):
        self.reported.append((value, step))

    def should_prune(self):
        return False


def test_the_loss_pool_rows_join_the_trial_table_of_the_stage_s_last_evaluation(tmp_path):
    """The loss pool is scored after a stage's last evaluation, at the same step: its rows must reach the trial's
    table (they are the law's targets) without replacing that evaluation's rows or reporting the step twice."""
    from harness.core.store import Row
    from harness.studies.sweep.worker import Reporter

    sweep = load_sweep(_sweep(tmp_path, {"metric": "greedy", "split": "heldout", "tasks": ["math"]}))
    trial = _Trial()
    reporter = Reporter(trial, sweep)
    reporter("b", 4, [Row("b", 4, "math", "heldout", "greedy", 0.25)])
    reporter("b", 8, [Row("b", 8, "math", "heldout", "greedy", 0.5)])
    reporter("b", 8, [Row("b", 8, "math", "loss_heldout", "eval_loss", 1.5)])
    table = reporter.stage_metrics()["b"]
    assert table == {"heldout": {"math": {"greedy": 0.5}}, "loss_heldout": {"math": {"eval_loss": 1.5}}}
    assert trial.reported == [(0.25, 4), (0.5, 8)]


def test_a_loss_pool_objective_reaches_the_pruner_once_at_the_stage_end(tmp_path):
    """The objective's rows arrive with the loss pool, after the stage's last evaluation at the same step: that step is
    reported then, once; the next stage's repeat of it at its start is not reported again."""
    from harness.core.store import Row
    from harness.studies.sweep.worker import Reporter

    sweep = load_sweep(_sweep(tmp_path, {"metric": "eval_loss", "split": "loss_heldout", "tasks": ["math"]}))
    trial = _Trial()
    reporter = Reporter(trial, sweep)
    reporter("b", 8, [Row("b", 8, "math", "heldout", "greedy", 0.5)])
    assert trial.reported == []  # no loss-pool row yet: nothing to report
    reporter("b", 8, [Row("b", 8, "math", "loss_heldout", "eval_loss", 1.5)])
    reporter("b", 8, [Row("b", 8, "math", "loss_heldout", "eval_loss", 1.5)])
    assert trial.reported == [(1.5, 8)]
