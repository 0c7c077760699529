"""Metric-driven steering (docs/steering.md, "Steering by a held-out score"): the groupdro controller as a pure
function — a null where nothing differs between the tasks (no drift beyond the noise it is fed) and a planted seesaw
(it finds the minimax mixture) at the shipped regime (two tasks, 13 updates, 32 steering items per task); the config's
errors by YAML path and its resolved defaults; the steering split (disjoint from every pool, deterministic, its size
refused by YAML path when a recipe cannot give it); and one tiny run end to end whose logged weights replay from its
logged steering errors."""

from __future__ import annotations

import copy
import math

import numpy as np
import polars as pl
import pytest

from harness.config import load_experiment, parse_mixture, update_interval
from harness.core.store import read_metrics
from harness.data.steering import GroupDRO, floored
from harness.data.steering.groupdro import groupdro_step, hedge_rate
from harness.data.steering_items import steering_examples
from harness.data.task_data import DataError
from harness.runs.planning.prepare import build_task_data
from harness.runs.planning.steering_split import SteeringSplits, steering_draw
from tests.conftest import TINY, invoke, write_yaml

# the shipped regime: a 700-step stage, every: auto = 50 steps, the last batch's update skipped (13 updates); 32 items
UPDATES, ITEMS = 13, 32


def test_the_step_is_hedges_on_the_errors_and_normalised():
    assert hedge_rate(2, UPDATES) == pytest.approx(math.sqrt(8 * math.log(2) / UPDATES))
    log_q = groupdro_step(np.log([0.5, 0.5]), np.array([0.6, 0.4]), 1.0)
    assert np.exp(log_q).sum() == pytest.approx(1.0)
    assert np.exp(log_q)[0] == pytest.approx(1 / (1 + math.exp(-0.2)))  # odds move by exp(η·(e0 − e1))
    # a task with no measurement (nan) is the paper's absent group: its loss counts 0
    assert np.exp(groupdro_step(np.log([0.5, 0.5]), np.array([np.nan, 0.3]), 1.0))[1] > 0.5


def _simulate(accuracy, sims: int, seed: int = 0) -> np.ndarray:
    """Task A's sampling weight after each of UPDATES updates of groupdro (hedge rate, floor 0.01), fed the errors of
    ITEMS binomial items per task whose accuracy is ``accuracy(share_A)``; [sims, UPDATES]."""
    rng = np.random.default_rng(seed)
    out = np.empty((sims, UPDATES))
    for s in range(sims):
        controller = GroupDRO(np.array([0.5, 0.5]), {"eta": "hedge"})
        controller.begin(UPDATES)
        for t in range(UPDATES):
            share = floored(controller.probs(), 0.01)[0]
            correct = rng.binomial(ITEMS, accuracy(share)) / ITEMS
            controller.update(1.0 - correct, np.ones(2))
            out[s, t] = floored(controller.probs(), 0.01)[0]
    return out


def test_on_a_null_the_weights_only_wander_as_far_as_the_noise_fed_to_them():
    """Both tasks at accuracy 0.4 whatever the mixture: the log-odds of the weights are η × a sum of UPDATES
    differences of two binomial error rates, mean 0 and sd η·sqrt(UPDATES·2·p(1−p)/ITEMS) = 0.29 (derived, not
    measured); the simulated spread must match it and show no drift."""
    finals = _simulate(lambda share: np.array([0.4, 0.4]), sims=2000)[:, -1]
    log_odds = np.log(finals / (1 - finals))
    eta = hedge_rate(2, UPDATES)
    expected_sd = eta * math.sqrt(UPDATES * 2 * 0.4 * 0.6 / ITEMS)
    assert abs(log_odds.mean()) < 3 * expected_sd / math.sqrt(len(finals))  # no drift
    assert log_odds.std() == pytest.approx(expected_sd, rel=0.1)
    # what a reader sees: 95 % of null runs end with the weight inside [0.36, 0.64] (sigmoid of ±1.96 sd)
    low, high = np.quantile(finals, [0.025, 0.975])
    assert 0.33 < low < 0.4 and 0.6 < high < 0.67, (low, high)


def test_on_a_planted_seesaw_it_moves_to_the_minimax_mixture():
    """Task A's accuracy 0.6·sqrt(share_A), task B's 0.9·sqrt(1 − share_A): the worse task's accuracy is highest at
    share_A = 0.81 / 1.17 = 0.692, where both equal; from 0.5 the controller reaches it within UPDATES updates and
    the worse task's expected accuracy at its last weights beats the start's."""

    def accuracy(share):
        return np.array([0.6 * math.sqrt(share), 0.9 * math.sqrt(1 - share)])

    weights = _simulate(lambda share: accuracy(share), sims=500)
    late = weights[:, UPDATES // 2 :].mean(axis=1)
    assert np.mean(np.abs(late - 0.692) < 0.1) > 0.9
    worst = np.array([accuracy(w).min() for w in weights[:, -1]])
    assert np.mean(worst > accuracy(0.5).min()) > 0.9


# ------------------------------------------------------------------------------------------------------------------
# Config
# ------------------------------------------------------------------------------------------------------------------


def test_defaults_are_resolved_and_reload():
    errors: list = []
    m = parse_mixture({"adaptive": {"method": "groupdro"}}, "m", ["a", "b"], errors)
    assert not errors
    assert m.to_yaml()["adaptive"] == {
        "method": "groupdro",
        "tasks": ["a", "b"],
        "start": "natural",
        "every": "auto",
        "floor": 0.01,
        "signal": "steering_error",
        "steering": {"split": "heldout_template", "metric": "greedy", "items": 32},
        "eta": "hedge",
    }
    assert parse_mixture(m.to_yaml(), "m", ["a", "b"], []) == m
    loss = parse_mixture({"adaptive": {"method": "groupdro", "signal": "train_loss", "eta": 0.5}}, "m", ["a", "b"], [])
    assert loss.adaptive.every == 1 and "steering" not in loss.to_yaml()["adaptive"]
    assert update_interval(m.adaptive, 700) == 50 and update_interval(m.adaptive, 4) == 1


@pytest.mark.parametrize(
    "spec, path, words",
    [
        ({"method": "groupdro", "eta": 0}, "m.adaptive.eta", "> 0"),
        ({"method": "groupdro", "signal": "train_loss"}, "m.adaptive", "give eta a number"),
        ({"method": "groupdro", "every": "often"}, "m.adaptive.every", "auto or a whole number"),
        ({"method": "groupdro", "signal": "train_loss", "steering": {}}, "m.adaptive.steering", "steering_error only"),
        ({"method": "odm", "signal": "steering_error"}, "m.adaptive.signal", "train_loss"),
        ({"method": "groupdro", "steering": {"split": "train"}}, "m.adaptive.steering.split", "heldout_template"),
        ({"method": "groupdro", "steering": {"metric": "mode_ok"}}, "m.adaptive.steering.metric", "greedy"),
        ({"method": "groupdro", "steering": {"items": 4}}, "m.adaptive.steering.items", ">= 8"),
        ({"method": "groupdro", "steering": {"itmes": 9}}, "m.adaptive.steering.itmes", "did you mean 'items'"),
    ],
)
def test_bad_steering_settings_name_their_yaml_path(spec, path, words):
    errors: list = []
    assert parse_mixture({"adaptive": spec}, "m", ["a", "b"], errors) is None
    assert any(where == path and words in message for where, message in errors), errors


# ------------------------------------------------------------------------------------------------------------------
# The steering split, and a tiny run end to end
# ------------------------------------------------------------------------------------------------------------------


TASKS = ["repeat", "yesno", "math"]


def _steered_tiny(
    items: int = 8, metric: str = "greedy", split: str = "heldout", tasks: list = TASKS, **adaptive
) -> dict:
    tiny = copy.deepcopy(TINY)
    tiny["stages"][1] = {
        "name": "b",
        "steps": 8,
        "mixture": {
            "adaptive": {
                "method": "groupdro",
                "tasks": list(tasks),
                "every": 2,
                "steering": {"split": split, "items": items, "metric": metric},
                **adaptive,
            }
        },
    }
    tiny["train"]["stage_cache"] = False
    return tiny


def _prompt(example) -> str:
    return repr(example.messages[:-1])


@pytest.mark.parametrize("imitated, tasks", [("heldout", TASKS), ("heldout_template", ["repeat", "yesno"])])
def test_the_steering_split_is_disjoint_from_every_pool_and_deterministic(imitated, tasks, tmp_path):
    """No steering prompt is in any pool; a heldout_template steering item is an item the run trains on (in an unseen
    phrasing), a heldout one is not — also for math, whose train split changes with how many eval items are drawn."""
    exp = load_experiment(write_yaml(tmp_path / "s.yaml", _steered_tiny(split=imitated, tasks=tasks)))
    data = build_task_data(exp)
    stage = exp.resolved_stages()[1]
    split = steering_examples(data, steering_draw(exp, stage, 1))
    assert set(split) == set(tasks)
    for task, examples in split.items():
        taken = {_prompt(ex) for pool in data.splits[task].values() for ex in pool}
        assert len(examples) == 8 and len({_prompt(ex) for ex in examples}) == 8
        assert not {_prompt(ex) for ex in examples} & taken
        trained = {ex.meta["item"] for ex in data.splits[task]["train"]}
        assert all((ex.meta["item"] in trained) == (imitated == "heldout_template") for ex in examples), task
    again = steering_examples(build_task_data(exp), steering_draw(exp, stage, 1))
    assert {t: [_prompt(e) for e in ex] for t, ex in again.items()} == {
        t: [_prompt(e) for e in ex] for t, ex in split.items()
    }


def test_a_steering_split_a_recipe_cannot_give_is_refused_by_yaml_path(tmp_path):
    exp = load_experiment(write_yaml(tmp_path / "s.yaml", _steered_tiny(items=5000)))
    with pytest.raises(DataError, match=r"stages\[1\]\.mixture\.adaptive\.steering\.items: task 'repeat'"):
        steering_examples(build_task_data(exp), steering_draw(exp, exp.resolved_stages()[1], 1))
    # math's train split changes with how many eval items are drawn: a larger draw's heldout_template items are
    # another train split's, and none is an item this run trains on
    exp = load_experiment(write_yaml(tmp_path / "m.yaml", _steered_tiny(split="heldout_template")))
    with pytest.raises(DataError, match="task 'math' gives only 0 heldout_template items that no pool holds"):
        steering_examples(build_task_data(exp), steering_draw(exp, exp.resolved_stages()[1], 1))


def test_a_steered_run_logs_its_errors_and_its_weights_follow_them(tmp_path, monkeypatch):
    """The real measurement runs at every update (every task, n = items, a Wilson interval); a tiny model scores
    nothing, so the run is then fed planted errors (repeat 0.9, math 0.5, yesno 0.1): they are what the store logs,
    the weights are those groupdro's rule gives from them (replayed here), and repeat is drawn the most."""
    measured = []
    real = SteeringSplits.measure

    def planted(self, index, stage, model, shard):
        measure = real(self, index, stage, model, shard)

        def errors():
            measured.append(measure())
            return {t: (e, 8, max(0.0, e - 0.2), min(1.0, e + 0.2)) for t, e in PLANTED.items()}

        return measure and errors

    monkeypatch.setattr(SteeringSplits, "measure", planted)
    exp_file = write_yaml(tmp_path / "s.yaml", _steered_tiny(eta=3.0))
    result = invoke("run", str(exp_file), "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    assert len(measured) == 3  # after batches 2, 4, 6 of 8: the last batch's update would be wasted
    for errors in measured:
        assert set(errors) == set(PLANTED)
        assert all(n == 8 and 0 <= low <= e <= high <= 1 for e, n, low, high in errors.values())

    frame = read_metrics(tmp_path / "run").filter(pl.col("stage") == "b").sort("step", "task")
    logged = frame.filter(pl.col("metric") == "steering_error")
    weights = frame.filter(pl.col("metric") == "mixture_weight")
    assert logged["step"].unique().to_list() == [6, 8, 10]
    tasks = sorted(PLANTED)  # the frame's order; groupdro's step and the floor act task by task
    log_q = np.log(np.full(3, 1 / 3))  # start natural: three pools of 40
    for step in [6, 8, 10]:
        errors = logged.filter(pl.col("step") == step)
        assert errors["task"].to_list() == tasks and errors["value"].to_list() == [PLANTED[t] for t in tasks]
        log_q = groupdro_step(log_q, errors["value"].to_numpy(), 3.0)
        at = weights.filter(pl.col("step") == step)["value"].to_numpy()
        np.testing.assert_allclose(at, floored(np.exp(log_q), 0.01), rtol=1e-12)
    drawn = frame.filter(pl.col("metric") == "mix_examples")
    assert drawn.sort("value")["task"][-1] == "repeat"


PLANTED = {"repeat": 0.9, "math": 0.5, "yesno": 0.1}


def test_two_ranks_measure_the_steering_split_together(tmp_path):
    """Under --nproc 2 (gloo) every rank measures its share of the steering items at each update and the shares are
    gathered (a rank that skipped the measurement would hang the other): the same errors, with the same n, and the
    same weights as one process."""
    from tests.conftest import run_cli

    exp_file = write_yaml(tmp_path / "s.yaml", _steered_tiny(metric="tf_first"))
    runs = {}
    for name, extra in (("one", []), ("two", ["--nproc", "2"])):
        out = tmp_path / name
        env = {"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
        result = run_cli("run", str(exp_file), "--out", str(out), *extra, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = (
            read_metrics(out)
            .filter(pl.col("metric").is_in(["steering_error", "mixture_weight"]))
            .select("step", "task", "metric", "value", "n")
            .sort("step", "task", "metric")
        )
    assert runs["one"].height == 3 * 3 + 4 * 3  # 3 updates; the start's weights too
    assert runs["one"].equals(runs["two"])


def test_an_interval_longer_than_the_stage_is_refused_by_yaml_path(tmp_path):
    file = write_yaml(tmp_path / "s.yaml", _steered_tiny(every=9))
    result = invoke("validate", str(file))
    assert result.exit_code == 2 and "stages[1].mixture.adaptive.every: every 9 > the stage's 8 steps" in result.output
