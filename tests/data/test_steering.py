"""Adaptive stage mixtures (docs/steering.md): the controllers as pure functions on synthetic loss streams whose right
answer is known, the stream's determinism and resume, the config's errors by YAML path and the stage-cache key, and
one tiny run end to end (weights in the store, the same trajectory from the same seed, resumed mid-stage exactly)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.config import parse_mixture
from harness.core.registry import MIXTURE_CONTROLLERS
from harness.core.store import read_metrics
from harness.data.steering import DoReMi, OnlineDataMixing, floored
from harness.data.steering.doremi import START_UPDATES
from harness.data.steering.odm import exploration
from harness.data.steering.stream import AdaptiveStream
from tests.conftest import MICRO, drift_bound, rows_reversed_run, run_cli, write_yaml

runner = CliRunner()


# ------------------------------------------------------------------------------------------------------------------
# Synthetic problems: per-task losses that respond to how much of each task has been trained on
# ------------------------------------------------------------------------------------------------------------------


@dataclass
class Synthetic:
    """Task i's loss after n_i examples: floor_i + (start_i − floor_i)·exp(−rate_i·n_i), plus Gaussian noise.
    A noise task has rate 0 (its loss cannot fall); a lagging learnable task starts high and falls."""

    start: np.ndarray
    floor: np.ndarray
    rate: np.ndarray
    noise: float = 0.02

    def losses(self, seen: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        mean = self.floor + (self.start - self.floor) * np.exp(-self.rate * seen)
        return mean + self.noise * rng.standard_normal(len(mean))


def simulate(controller, problem: Synthetic, steps: int = 400, batch: int = 16, floor: float = 0.01, seed: int = 0):
    """Draw ``batch`` examples per step from the floored weights, observe the per-task losses, update; returns the
    weight trajectory [steps + 1, K]."""
    rng = np.random.default_rng(seed)
    seen = np.zeros(len(problem.start))
    trajectory = [floored(controller.probs(), floor)]
    for _ in range(steps):
        p = trajectory[-1]
        counts = np.bincount(rng.choice(len(p), size=batch, p=p / p.sum()), minlength=len(p)).astype(float)
        seen += counts
        losses = np.where(counts > 0, problem.losses(seen, rng), np.nan)
        controller.update(losses, counts, p)  # what the counts were drawn from: the floored weights
        trajectory.append(floored(controller.probs(), floor))
    return np.array(trajectory)


# Three tasks: 0 learnt quickly (low loss), 1 learnable but lagging (starts high, learns slowly), 2 noise (high loss
# that cannot fall: random labels).
PROBLEM = Synthetic(
    start=np.array([2.0, 4.0, 4.0]), floor=np.array([0.1, 0.3, 4.0]), rate=np.array([0.02, 0.0003, 0.0])
)
UNIFORM = np.ones(3) / 3


def test_odm_exploration_follows_the_paper():
    assert exploration(0, 4) == 0.25 and exploration(1, 4) == 0.25  # ε_0 = 1/K; capped at 1/K
    assert exploration(100, 4) == pytest.approx(math.sqrt(math.log(4) / 400))


def test_odm_moves_weight_to_the_high_loss_tasks_noise_included():
    """ODM's reward is the training loss (Albalak et al. 2023): the lagging learnable task gains over the learnt
    one — and so does a task whose loss cannot fall (the paper's reward cannot tell noise from lag)."""
    weights = simulate(OnlineDataMixing(UNIFORM, {"alpha": 0.9}), PROBLEM)
    late = weights[-100:].mean(0)
    # Exp3's moves are mild (ε_t decays, and an arm's reward estimate L/π shrinks as its π grows): ~0.34 / 0.28.
    assert late[1] > late[0] + 0.04 and late[0] < UNIFORM[0] - 0.03  # lagging gains, learnt loses
    assert late[2] > UNIFORM[2] + 0.03  # the hazard: noise absorbs weight too (the most, ~0.38)
    two = Synthetic(PROBLEM.start[:2], PROBLEM.floor[:2], PROBLEM.rate[:2])  # without the noise task
    late2 = simulate(OnlineDataMixing(np.ones(2) / 2, {"alpha": 0.9}), two)[-100:].mean(0)
    assert late2[1] > 0.51


def test_doremi_lagging_task_gains_and_noise_does_not():
    """DoReMi (Xie et al. 2023) raises the tasks whose loss exceeds the reference: with a reference run's losses
    (what each task reached when trained alone: the learnable floors, and the noise task's own floor), the lagging
    task gains and the noise task, at its reference from the start, does not absorb the weight."""
    reference = PROBLEM.floor + np.array([0.05, 0.05, 0.0])
    weights = simulate(DoReMi(UNIFORM, {"eta": 1.0, "smoothing": 1e-3}, reference), PROBLEM)
    late = weights[-100:].mean(0)
    assert late[1] > 0.9, late
    assert late[2] < 0.05, late


def test_doremi_from_the_stages_start_raises_the_task_being_forgotten():
    """``reference: start``: the excess is the loss risen above where the stage began — the seesaw's forgetting.
    A task whose loss rises gains; a learning task (below its start) and a flat noise task stay where they were."""
    controller = DoReMi(UNIFORM, {"eta": 0.2, "smoothing": 1e-3})
    rng = np.random.default_rng(1)
    for t in range(200):
        losses = np.array([2.0 - 0.005 * t, 1.0 + 0.004 * t, 4.0]) + 0.01 * rng.standard_normal(3)
        controller.update(losses, np.array([5.0, 5.0, 6.0]))
        if t + 1 < START_UPDATES:  # the reference is still being measured: no move yet
            assert np.allclose(controller.probs(), UNIFORM)
    final = controller.probs()
    assert final[1] > 0.8 and final[0] < 0.1, final
    assert np.argmax(final) == 1


@pytest.mark.parametrize("name", MIXTURE_CONTROLLERS.names())
def test_controllers_are_deterministic_and_their_state_round_trips(name):
    cls = MIXTURE_CONTROLLERS.get(name)
    params = dict(cls.defaults)
    params.pop("reference", None)
    a, b = cls(UNIFORM, params), cls(UNIFORM, params)
    a.begin(50)
    b.begin(50)  # the stage's number of updates (a fixed-horizon step size reads it)
    first = simulate(a, PROBLEM, steps=50, seed=4)
    assert np.array_equal(first, simulate(b, PROBLEM, steps=50, seed=4))
    c = cls(UNIFORM, params)
    c.load(a.state())
    assert np.array_equal(simulate(a, PROBLEM, steps=30, seed=5), simulate(c, PROBLEM, steps=30, seed=5))


def test_the_floor_keeps_every_task_and_sums_to_one():
    p = floored(np.array([1.0, 0.0, 0.0]), 0.05)
    assert p.min() == pytest.approx(0.05) and p.sum() == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------------------------------
# The stream: seeded draws, resume, composition
# ------------------------------------------------------------------------------------------------------------------


@dataclass
class Example:
    task: str
    index: int = 0
    length: int = 3
    n_supervised: int = 1


def _stream(seed: int, method: str = "odm"):
    mixture = parse_mixture({"adaptive": {"method": method, "every": 2}}, "m", ["a", "b"], [])
    pools = {"a": [Example("a", i) for i in range(7)], "b": [Example("b", i) for i in range(13)]}
    return AdaptiveStream(mixture.adaptive, pools, 30, 8, np.random.default_rng(seed), lambda ex: ex, {"b": 2})


def _drive(stream, steps: int, start: int = 0) -> list:
    out = []
    for i in range(start, start + steps):
        batch = stream.next_batch()
        out.append([(e.task, e.index) for e in batch])
        if (i + 1) % stream.spec.every == 0:  # task a's loss stays high: ODM moves weight to it
            stream.observe(np.array([3.0, 0.5]))
            out.append(stream.weights().tolist())
    return out


def test_same_seed_same_draws_and_weights_and_resume_continues_exactly():
    full = _drive(_stream(1), 30)
    assert _drive(_stream(1), 30) == full and _drive(_stream(2), 30) != full
    half = _stream(1)
    first = _drive(half, 13)
    resumed = _stream(1)
    resumed.load(half.state())
    assert first + _drive(resumed, 17, start=13) == full
    weights = [w for w in full if isinstance(w[0], float)]
    assert weights[-1][0] > 0.45 > 7 / 20  # the high-loss task gained over its natural start share


def test_odm_importance_weight_is_the_probability_the_stream_sampled_with():
    """Exp3's reward estimate divides the loss by the probability its arm was drawn with (Albalak et al. 2023,
    Algorithm 1): the stream draws from the floored policy, so a task the floor lifts from 0.02 to 0.116 is weighted
    by 1/0.116, not 1/0.02."""
    mixture = parse_mixture({"adaptive": {"method": "odm", "every": 1, "floor": 0.1}}, "m", ["a", "b"], [])
    pools = {"a": [Example("a", i) for i in range(7)], "b": [Example("b", i) for i in range(13)]}
    stream = AdaptiveStream(mixture.adaptive, pools, 5, 64, np.random.default_rng(0), lambda ex: ex, {})
    stream.controller.load({"rewards": [0.0, 0.0], "t": 3, "policy": [0.98, 0.02]})
    sampled = stream.weights()
    assert sampled == pytest.approx([0.8 * 0.98 + 0.1, 0.8 * 0.02 + 0.1])
    batch = stream.next_batch()
    assert {e.task for e in batch} == {"a", "b"}  # both drawn (64 draws at 0.116): both rewards move
    losses = np.array([2.0, 3.0])
    stream.observe(losses)
    alpha = stream.controller.params["alpha"]
    assert stream.controller.rewards == pytest.approx((1 - alpha) * losses / sampled)


def test_composition_counts_what_was_drawn():
    stream = _stream(3)
    _drive(stream, 10)
    c = stream.composition
    assert c["a"]["examples"] + c["b"]["examples"] == 80
    assert c["a"]["share"] + c["b"]["share"] == pytest.approx(1.0)
    assert c["b"]["dropped_too_long"] == 2 and c["a"]["tokens"] == 3 * c["a"]["examples"]


# ------------------------------------------------------------------------------------------------------------------
# Config: errors by YAML path, resolved settings, the stage-cache key
# ------------------------------------------------------------------------------------------------------------------


def _micro_with(mixture, **stage) -> dict:
    import yaml

    data = yaml.safe_load(MICRO.read_text())
    data["stages"][1] = {**data["stages"][1], "mixture": mixture, **stage}
    return data


@pytest.mark.parametrize(
    "mixture, stage, path, words",
    [
        ({"adaptive": {"method": "odn"}}, {}, "stages[1].mixture.adaptive.method", "did you mean 'odm'"),
        (
            {"adaptive": {"method": "odm", "floor": 0.3, "tasks": ["yesno", "math", "repeat", "identity"]}},
            {},
            "stages[1].mixture.adaptive.floor",
            "[0, 1/K)",
        ),
        ({"adaptive": {"method": "doremi", "eta": 0}}, {}, "stages[1].mixture.adaptive.eta", "> 0"),
        (
            {"adaptive": {"method": "odm", "tasks": ["yesno", "mathh"]}},
            {},
            "stages[1].mixture.adaptive.tasks",
            "did you mean 'math'",
        ),
        (
            {"adaptive": {"method": "odm", "start": {"yesno": 1, "math": 0}}},
            {},
            "stages[1].mixture.adaptive.start.math",
            "> 0",
        ),
        ({"adaptive": {"method": "odm", "every": 0}}, {}, "stages[1].mixture.adaptive.every", ">= 1"),
        ({"adaptive": {"method": "odm", "ett": 1}}, {}, "stages[1].mixture.adaptive.ett", "unknown setting"),
        (
            {"adaptive": {"method": "odm", "signal": "eval_score"}},
            {},
            "stages[1].mixture.adaptive.signal",
            "train_loss",
        ),
        ({"adaptive": {"method": "odm"}}, {"length_grouping": 4}, "stages[1].length_grouping", "length_grouping: 1"),
    ],
)
def test_bad_adaptive_mixtures_name_their_yaml_path(mixture, stage, path, words, tmp_path):
    file = write_yaml(tmp_path / "bad.yaml", _micro_with(mixture, **stage))
    result = runner.invoke(app, ["validate", str(file)])
    assert result.exit_code == 2, result.output
    hits = [line.strip() for line in result.output.splitlines() if line.strip().startswith(f"{path}:")]
    assert hits and any(words in h for h in hits), result.output


def test_defaults_alone_work_and_every_setting_is_resolved():
    errors = []
    m = parse_mixture({"adaptive": {"method": "doremi"}}, "m", ["a", "b"], errors)
    assert not errors and m.kind == "adaptive"
    assert m.to_yaml() == {
        "adaptive": {
            "method": "doremi",
            "tasks": ["a", "b"],
            "start": "natural",
            "every": 1,
            "floor": 0.01,
            "signal": "train_loss",
            "eta": 1.0,
            "smoothing": 1e-3,
            "reference": "start",
        }
    }
    assert parse_mixture(m.to_yaml(), "m", ["a", "b"], []) == m  # the resolved form reloads to the same mixture


def test_the_adaptive_settings_are_in_the_stage_cache_key(tmp_path):
    from harness.config import load_experiment
    from harness.runs.planning.stage_key import stage_keys

    def keys(mixture):
        exp = load_experiment(write_yaml(tmp_path / "k.yaml", _micro_with(mixture)))
        return stage_keys(exp, {"source": "x"}, "data", "cpu")

    odm = keys({"adaptive": {"method": "odm"}})
    assert odm[0] == keys({"adaptive": {"method": "doremi"}})[0]  # stages before it: unchanged
    others = [
        keys({"adaptive": {"method": "doremi"}}),
        keys({"adaptive": {"method": "odm", "alpha": 0.5}}),
        keys({"adaptive": {"method": "odm", "every": 3}}),
    ]
    assert len({odm[1], *(k[1] for k in others)}) == 4


# ------------------------------------------------------------------------------------------------------------------
# End to end: a tiny run whose second stage is adaptive
# ------------------------------------------------------------------------------------------------------------------


def _adaptive_tiny(tiny: dict) -> dict:
    tiny["stages"][1] = {
        "name": "b",
        "steps": 8,
        "mixture": {"adaptive": {"method": "odm", "tasks": ["repeat", "yesno", "math"]}},
    }
    tiny["train"].update({"checkpoint_every": 2, "stage_cache": False})
    return tiny


def _comparable(run_dir):
    return (
        read_metrics(run_dir)
        .filter(pl.col("metric") != "tokens_per_s")
        .select("stage", "step", "task", "split", "metric", "value", "text")
        .sort("step", "stage", "task", "split", "metric", nulls_last=True)
    )


@pytest.fixture(scope="module")
def adaptive_run(tmp_path_factory):
    import copy

    from tests.conftest import TINY

    root = tmp_path_factory.mktemp("steer")
    exp_file = write_yaml(root / "adaptive.yaml", _adaptive_tiny(copy.deepcopy(TINY)))
    result = run_cli("run", str(exp_file), "--out", str(root / "whole"))
    assert result.returncode == 0, result.stderr[-3000:]
    return exp_file, root / "whole"


def test_an_adaptive_stage_logs_its_weights_and_its_composition(adaptive_run):
    _, run_dir = adaptive_run
    frame = read_metrics(run_dir)
    weights = frame.filter(pl.col("metric") == "mixture_weight").sort("step")
    assert set(weights["split"]) == {"train"} and set(weights["stage"]) == {"b"}
    assert weights["step"].unique().sort().to_list() == list(range(4, 13))  # the start, then every update
    by_step = weights.group_by("step").agg(pl.col("value").sum(), pl.col("task").n_unique())
    assert (by_step["task"] == 3).all() and ((by_step["value"] - 1).abs() < 1e-9).all()
    assert weights["value"].min() >= 0.01 - 1e-12  # the floor
    last = weights.filter(pl.col("step") == 12)["value"]
    assert (last - 1 / 3).abs().max() > 1e-3  # the controller moved them
    share = frame.filter(pl.col("metric") == "mix_share", pl.col("stage") == "b")
    assert share.height == 3 and abs(share["value"].sum() - 1) < 1e-9
    summary = __import__("json").loads((run_dir / "summary.json").read_text())
    assert summary["stages"][1]["mixture"]["adaptive"]["method"] == "odm"
    assert sum(c["examples"] for c in summary["stages"][1]["composition"].values()) == 8 * 4


def test_the_run_report_draws_the_weight_trajectory(adaptive_run, tmp_path):
    from analysis.report.run import run_report

    html = run_report(adaptive_run[1], tmp_path / "report").read_text()
    assert (tmp_path / "report" / "mixture_weights.png").stat().st_size > 0
    assert "mixture_weights.png" in html and "adaptive: odm over repeat, yesno, math" in html


def test_an_adaptive_run_killed_mid_stage_resumes_to_the_same_store(adaptive_run, tmp_path):
    """Same seed ⇒ the same weight trajectory and losses; killed at step 10 (resume point: step 8, inside the
    adaptive stage, after four of its updates), resumed, the store equals the uninterrupted run's exactly."""
    exp_file, whole = adaptive_run
    out = tmp_path / "killed"
    killed = run_cli("run", str(exp_file), "--out", str(out), "--set", "debug.kill_rank={rank: 0, step: 10}")
    assert killed.returncode != 0 and (out / "checkpoints" / "resume" / "step-00000008").is_dir()
    resumed = run_cli("run", str(exp_file), "--resume", str(out))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _comparable(out).equals(_comparable(whole))


@pytest.fixture(scope="module")
def adaptive_rows_reversed(adaptive_run, tmp_path_factory):
    """``adaptive_run``'s experiment in one process with every drawn batch's rows reversed (tests/conftest.py): the
    same draws and losses summed in another order, the reference of the two-rank comparison's tolerance."""
    return rows_reversed_run(adaptive_run[0], tmp_path_factory.mktemp("steer_reversed") / "reversed", [])


def test_two_ranks_steer_like_one_process(adaptive_run, adaptive_rows_reversed, tmp_path):
    """Under --nproc 2 (gloo) each rank feeds its controller the all-reduced per-task losses, so both draw the same
    global batches as one process would: the same composition, and the same weights to rounding — within
    DRIFT_FACTOR × how far one process's weights move with its batches' rows reversed (tests/conftest.py); a rank
    steering on its own half's losses would move them by ~1e-2."""
    exp_file, whole = adaptive_run
    out = tmp_path / "two"
    result = run_cli(
        "run", str(exp_file), "--out", str(out), "--nproc", "2", env={"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    one, two, reordered = (
        read_metrics(d).sort("step", "stage", "task", "metric") for d in (whole, out, adaptive_rows_reversed)
    )

    def rows(frame, metric):
        return frame.filter(pl.col("metric") == metric).select("step", "task", "value")

    a, b, r = rows(one, "mixture_weight"), rows(two, "mixture_weight"), rows(reordered, "mixture_weight")
    assert a.select("step", "task").equals(b.select("step", "task")) and a.height == 27
    assert a.select("step", "task").equals(r.select("step", "task"))
    reference = (a["value"] - r["value"]).abs().max()
    assert (a["value"] - b["value"]).abs().max() <= drift_bound([reference]), reference
    assert rows(one, "mix_examples").equals(rows(two, "mix_examples"))


def test_analysis_flattens_an_adaptive_mixture_as_its_own_kind():
    from analysis.loading import flatten_config

    flat = flatten_config(
        {
            "tasks": {"a": {"train": 10}, "b": {"train": 30}},
            "stages": [
                {"name": "s", "mixture": {"adaptive": {"method": "odm", "tasks": ["a", "b"], "start": "natural"}}}
            ],
        }
    )
    assert flat["stages.s.mixture.kind"] == "adaptive" and flat["stages.s.mixture.adaptive.method"] == "odm"
    assert (flat["stages.s.mixture.a"], flat["stages.s.mixture.b"]) == (0.25, 0.75)  # the natural start


def test_an_adaptive_stage_replayed_from_the_stage_cache_keeps_its_rows_and_composition(tmp_path):
    """A second run of the same experiment replays both stages from the stage cache: the same store (weights
    included) and, in summary.json, the adaptive stage's composition as the first run drew it."""
    import copy
    import json

    from tests.conftest import TINY

    exp = _adaptive_tiny(copy.deepcopy(TINY))
    exp["train"]["stage_cache"] = True
    exp_file = write_yaml(tmp_path / "cached.yaml", exp)
    for name in ("first", "second"):
        result = run_cli("run", str(exp_file), "--out", str(tmp_path / name))
        assert result.returncode == 0, result.stderr[-3000:]
    replayed = read_metrics(tmp_path / "second").filter(
        pl.col("stage") == "b", ~pl.col("metric").str.starts_with("seesaw")
    )
    assert replayed.height and replayed["cached_from"].is_not_null().all()  # stage b replayed (seesaw: at run end)
    first, second = (json.loads((tmp_path / n / "summary.json").read_text()) for n in ("first", "second"))
    assert second["stages"][1]["composition"] == first["stages"][1]["composition"]
    assert sum(c["examples"] for c in second["stages"][1]["composition"].values()) == 32
    weights = [
        read_metrics(tmp_path / n)
        .filter(pl.col("metric") == "mixture_weight")
        .select("step", "task", "value")
        .sort("step", "task")
        for n in ("first", "second")
    ]
    assert weights[0].height == 27 and weights[0].equals(weights[1])


def test_doremi_reads_its_reference_from_an_earlier_run(tmp_path):
    """``reference: <run dir>``: each task's last training loss in that run's store; a run without one, or no run
    there, is a DataError naming the stage and the setting (before any training)."""
    from harness.core.store import MetricsStore, Row
    from harness.data.stage_batches import reference_losses
    from harness.data.task_data import DataError

    store = MetricsStore(tmp_path / "ref", "r")
    (tmp_path / "ref").mkdir()
    store.log(
        [
            Row("s", 10, "a", "train", "loss", 2.0),
            Row("s", 20, "a", "train", "loss", 1.5),
            Row("s", 20, "b", "train", "loss", 0.7),
            Row("s", 20, "b", "heldout", "eval_loss", 9.0),
        ]
    )
    store.flush()

    def spec(reference):
        return parse_mixture({"adaptive": {"method": "doremi", "reference": reference}}, "m", ["a", "b"], []).adaptive

    assert reference_losses(spec(str(tmp_path / "ref")), "x") == {"a": 1.5, "b": 0.7}
    assert reference_losses(spec({"a": 1.0, "b": 2.0}), "x") == {"a": 1.0, "b": 2.0}
    assert reference_losses(spec("start"), "x") is None
    with pytest.raises(DataError, match="stage 'x': mixture.adaptive.reference .*cannot read"):
        reference_losses(spec(str(tmp_path / "nowhere")), "x")
    only_a = parse_mixture(
        {"adaptive": {"method": "doremi", "reference": str(tmp_path / "ref"), "tasks": ["a", "c"]}},
        "m",
        ["a", "b", "c"],
        [],
    ).adaptive
    with pytest.raises(DataError, match="no training loss of task 'c'"):
        reference_losses(only_a, "x")
