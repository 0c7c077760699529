"""The analysis package against small frames with known answers (no training: fast)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml

import analysis as A
from harness.core.seesaw import seesaw_events as in_run_events
from harness.core.store import SCHEMA

TASKS = ["yesno", "assistant_qa", "repeat"]
# The known linear law of the synthetic sweeps: greedy(target) = Σ_i LAW[i, target] · w_i  (rows: weight).
LAW = np.array([[0.95, 0.05, 0.30], [0.10, 0.90, 0.35], [0.40, 0.30, 0.85]])


# ----------------------------------------------------------------------------------------------------------------
# Builders (also used by test_report.py)
# ----------------------------------------------------------------------------------------------------------------


def metric_frame(points: list[tuple], run_id: str = "r1") -> pl.DataFrame:
    """A store frame from ``(stage, step, task, split, metric, value)`` tuples."""
    rows = [
        {
            "run_id": run_id,
            "stage": s,
            "step": st,
            "task": t,
            "split": sp,
            "metric": m,
            "value": float(v),
            "time": 0.0,
            "text": None,
        }
        for s, st, t, sp, m, v in points
    ]
    return pl.DataFrame(rows, schema=SCHEMA)


def curriculum(run_id: str = "r1", yesno_end: float = 0.9, qa_end: float = 0.2) -> pl.DataFrame:
    """Two stages; stage b starts from a's weights (its first evaluation repeats a's last one at step 4)."""
    series = {
        ("a", 0): {"yesno": 0.0, "assistant_qa": 0.0},
        ("a", 2): {"yesno": 0.1, "assistant_qa": 0.5},
        ("a", 4): {"yesno": 0.2, "assistant_qa": 0.7},
        ("b", 4): {"yesno": 0.2, "assistant_qa": 0.7},  # the repeat
        ("b", 6): {"yesno": 0.6, "assistant_qa": 0.4},  # seesaw: yesno +0.4, assistant_qa -0.3
        ("b", 8): {"yesno": yesno_end, "assistant_qa": qa_end},
    }
    points = [(s, st, t, "heldout", "greedy", v) for (s, st), vals in series.items() for t, v in vals.items()]
    points += [
        (s, st, t, "heldout", "ft_hijack", 1.0 - vals["assistant_qa"] if t == "assistant_qa" else 1.0)
        for (s, st), vals in series.items()
        for t in vals
    ]
    points += [
        ("a", 2, None, "train", "loss", 3.0),
        ("b", 6, None, "train", "loss", 2.0),
        ("b", 6, "yesno", "train", "loss", 1.5),
        ("b", 8, "yesno", "train", "mix_share", 0.5),
    ]
    return metric_frame(points, run_id)


def write_run(path: Path, frame: pl.DataFrame, config: dict | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    frame.write_parquet(path / "metrics.parquet")
    (path / "config.resolved.yaml").write_text(
        yaml.safe_dump(
            config
            or {
                "name": "toy",
                "seed": 1,
                "tasks": {"yesno": {"train": 30}, "assistant_qa": {"train": 10}},
                "eval": {"seesaw_delta": 0.25, "splits": ["heldout"]},
                "stages": [
                    {
                        "name": "a",
                        "steps": 4,
                        "init": "base",
                        "mixture": {"weights": {"yesno": 1, "assistant_qa": 3}},
                        "optim": {"lr": 0.01},
                    },
                    {
                        "name": "b",
                        "steps": 4,
                        "init": "previous",
                        "mixture": {"natural": ["yesno", "assistant_qa"]},
                        "optim": {"lr": 0.001},
                    },
                ],
            }
        )
    )
    return path


def make_trials(n: int = 40, seed: int = 0, noise: float = 0.0, run_dir: Path | None = None) -> pl.DataFrame:
    """Trials with exactly the sweep schema, whose final greedy follows :data:`LAW` (plus ``noise``)."""
    rng = np.random.default_rng(seed)
    w = rng.dirichlet(np.ones(len(TASKS)), size=n)
    y = w @ LAW + rng.normal(0, noise, size=(n, len(TASKS)))
    data: dict = {"number": list(range(n)), "state": ["COMPLETE"] * n}
    data["objective"] = y[:, :2].min(axis=1)  # min over yesno and assistant_qa, like yesno_vs_qa.yaml
    for i, t in enumerate(TASKS):
        data[f"param/stages[1].mixture.{t}"] = w[:, i]
    data["param/stages[1].optim.lr"] = rng.uniform(1e-4, 1e-3, n)
    for j, t in enumerate(TASKS):
        data[f"metric/warmup/heldout/{t}/greedy"] = np.full(n, 0.1)
        data[f"metric/mix/heldout/{t}/greedy"] = y[:, j]
        data[f"metric/mix/heldout/{t}/ft_hijack"] = 1 - y[:, j]
    data["duration_s"] = rng.uniform(10, 20, n)
    data["trial_dir"] = [str(run_dir) if run_dir else f"trials/{i:04d}" for i in range(n)]
    data["fail_reason"] = [None] * n
    data["pruned_step"] = [None] * n
    trials = pl.DataFrame(data, schema_overrides={"fail_reason": pl.Utf8, "pruned_step": pl.Int64})
    extra = pl.DataFrame(
        {
            "number": [n, n + 1],
            "state": ["PRUNED", "FAIL"],
            "pruned_step": [40, None],
            "fail_reason": [None, "non-finite loss at step 12"],
        },
        schema_overrides={"fail_reason": pl.Utf8, "pruned_step": pl.Int64},
    )
    return pl.concat([trials, extra], how="diagonal_relaxed")


def write_sweep(path: Path, trials: pl.DataFrame) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    trials.write_parquet(path / "trials.parquet")
    (path / "sweep.resolved.yaml").write_text(
        yaml.safe_dump(
            {
                "experiment": "experiments/quickstart.yaml",
                "study": {"name": "toy-sweep", "sampler": "tpe", "n_trials": trials.height},
                "space": {
                    "stages[1].mixture": {"simplex": TASKS},
                    "stages[1].optim.lr": {"float": [1e-4, 1e-3], "log": True},
                },
                "objective": {
                    "metric": "greedy",
                    "split": "heldout",
                    "tasks": ["yesno", "assistant_qa"],
                    "reduce": "min",
                    "stage": "mix",
                    "direction": "maximize",
                },
            }
        )
    )
    return path


# ----------------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------------


def test_load_runs_globs_config_columns_and_lazy(tmp_path):
    write_run(tmp_path / "runs" / "one", curriculum("r1"))
    write_run(tmp_path / "runs" / "two", curriculum("r2", yesno_end=0.5))
    frame = A.load_runs(str(tmp_path / "runs" / "*"))
    assert set(frame["run_id"].unique()) == {"r1", "r2"}
    for column in ("run_id", "stage", "step", "task", "split", "metric", "value", "time", "text", "run_dir"):
        assert column in frame.columns
    # Stages are keyed by name; a mixture becomes one share per task (weights normalised, natural = pool sizes).
    assert frame["stages.a.mixture.yesno"][0] == pytest.approx(0.25)
    assert frame["stages.b.mixture.yesno"][0] == pytest.approx(0.75)
    assert frame["stages.b.mixture.kind"][0] == "natural"
    assert frame["stages.b.optim.lr"][0] == pytest.approx(0.001)
    assert frame["eval.splits"][0] == '["heldout"]'
    lazy = A.load_runs(tmp_path / "runs", lazy=True, config=["stages.a.mixture"])
    assert isinstance(lazy, pl.LazyFrame)
    some = lazy.filter(pl.col("metric") == "greedy").collect()
    assert some["metric"].unique().to_list() == ["greedy"]
    assert "stages.a.mixture.yesno" in some.columns and "seed" not in some.columns
    with pytest.raises(A.AnalysisError, match="no run directory"):
        A.load_runs(tmp_path / "nothing-here")


def test_flatten_config_counts():
    flat = A.flatten_config({"stages": [{"name": "s", "mixture": {"counts": {"a": 30, "b": 10}, "replace": True}}]})
    assert flat["stages.s.mixture.a"] == pytest.approx(0.75)
    assert flat["stages.s.mixture.counts.b"] == 10 and flat["stages.s.mixture.replace"] is True
    assert flat["stages.s.index"] == 0


# ----------------------------------------------------------------------------------------------------------------
# Run frames
# ----------------------------------------------------------------------------------------------------------------


def test_stage_table_is_the_seed_table():
    frame = pl.concat([curriculum("r1"), curriculum("r2", yesno_end=0.5, qa_end=0.6)])
    table = A.stage_table(frame, "greedy", "heldout")
    assert table.columns == ["run_id", "stage", "step", "assistant_qa", "yesno"]
    assert table.select("run_id", "stage", "step").rows() == [
        ("r1", "a", 4),
        ("r1", "b", 8),
        ("r2", "a", 4),
        ("r2", "b", 8),
    ]
    assert table["yesno"].to_list() == pytest.approx([0.2, 0.9, 0.2, 0.5])
    assert table["assistant_qa"].to_list() == pytest.approx([0.7, 0.2, 0.7, 0.6])


def test_stage_bounds_and_dedupe_of_the_repeated_evaluation():
    frame = curriculum()
    bounds = A.stage_bounds(frame)
    assert bounds.select("stage", "index", "start", "end").rows() == [("a", 0, 0, 4), ("b", 1, 4, 8)]
    rows = A.eval_rows(frame, ["greedy"], "heldout")
    # The step-4 evaluation appears once, under the stage that produced it.
    at4 = rows.filter(pl.col("step") == 4)
    assert at4["stage"].unique().to_list() == ["a"] and at4.height == 2
    # A stage restarting from other weights keeps both points.
    restart = frame.with_columns(
        pl.when((pl.col("stage") == "b") & (pl.col("step") == 4))
        .then(pl.col("value") + 0.05)
        .otherwise(pl.col("value"))
        .alias("value")
    )
    assert A.eval_rows(restart, ["greedy"], "heldout").filter(pl.col("step") == 4).height == 4


def test_seesaw_events_match_the_in_run_definition():
    frame = pl.concat([curriculum("r1"), curriculum("r2", yesno_end=0.3, qa_end=0.9)])
    events = A.seesaw_events(frame, 0.25, metrics=["greedy"])
    r1 = events.filter(pl.col("run_id") == "r1")
    assert r1.select("step_from", "step_to", "rose", "fell").rows() == [(4, 6, "yesno", "assistant_qa")]
    assert r1["rose_by"][0] == pytest.approx(0.4) and r1["fell_by"][0] == pytest.approx(0.3)
    # r2's last step: yesno 0.6 → 0.3 (fell 0.3), assistant_qa 0.4 → 0.9 (rose 0.5): the reverse event too.
    r2 = events.filter(pl.col("run_id") == "r2")
    assert r2.select("step_to", "rose", "fell").rows() == [(6, "yesno", "assistant_qa"), (8, "assistant_qa", "yesno")]
    # Same as harness.core.seesaw on the raw rows, run by run.
    for run_id in ("r1", "r2"):
        raw = frame.filter(pl.col("run_id") == run_id, pl.col("metric") == "greedy", pl.col("task").is_not_null())
        expected = in_run_events(raw.to_dicts(), 0.25, ["greedy"])
        got = events.filter(pl.col("run_id") == run_id)
        # no stored events in these frames: recomputed with the untested rule, which has no p-value
        assert set(got["test"]) == {"none"} and got["p_value"].null_count() == got.height
        assert got.drop("run_id", "p_value", "test").to_dicts() == expected
    # The delta defaults to the run's eval.seesaw_delta when config columns are present.
    with_config = curriculum().with_columns(pl.lit(0.5).alias("eval.seesaw_delta"))
    assert A.seesaw_events(with_config, metrics=["greedy"]).is_empty()
    assert A.seesaw_events(curriculum().head(0)).columns[:3] == ["run_id", "metric", "split"]


def test_hijack_timeline():
    frame = curriculum()
    top1 = metric_frame([("b", 8, "assistant_qa", "heldout", "ft_top1", 0.75)]).with_columns(
        pl.lit(json.dumps([["Yes", 3], ["The", 1]])).alias("text")
    )
    timeline = A.hijack_timeline(pl.concat([frame, top1]))
    qa = timeline.filter(pl.col("task") == "assistant_qa")
    assert qa["step"].to_list() == [0, 2, 4, 6, 8]  # the repeated step-4 evaluation appears once
    assert qa["ft_hijack"].to_list() == pytest.approx([1.0, 0.5, 0.3, 0.6, 0.8])
    last = qa.row(-1, named=True)
    assert (last["top1"], last["top1_count"], last["top1_share"]) == ("Yes", 3, 0.75)
    with pytest.raises(A.AnalysisError, match="first_token"):
        A.hijack_timeline(frame.filter(pl.col("metric") == "greedy"))


def test_compare_deltas_and_text():
    a, b = curriculum("ra"), curriculum("rb", yesno_end=0.5, qa_end=0.6)
    deltas = A.compare(a, b, metrics=["greedy"])
    assert deltas.columns == ["stage", "task", "split", "metric", "a", "b", "delta"]
    end = {r["task"]: r for r in deltas.filter(pl.col("stage") == "b").iter_rows(named=True)}
    assert end["yesno"]["delta"] == pytest.approx(-0.4)
    assert end["assistant_qa"]["delta"] == pytest.approx(0.4)
    assert deltas.filter(pl.col("stage") == "a")["delta"].to_list() == pytest.approx([0.0, 0.0])
    text = A.format_compare(deltas, "ra", "rb")
    assert "0.900 → 0.500 (-0.400) ▼" in text and "0.200 → 0.600 (+0.400) ▲" in text
    # Lower is better for ft_hijack: a fall is an improvement.
    hij = A.compare(a, b, metrics=["ft_hijack"])
    assert "▲" in A.format_compare(hij.filter(pl.col("task") == "assistant_qa", pl.col("stage") == "b"))
    with pytest.raises(A.AnalysisError, match="one run per side"):
        A.compare(pl.concat([a, b]), b)


def test_worst_failures_and_readable_prompts(tmp_path):
    run = write_run(tmp_path / "run", curriculum())
    samples = []
    for step, stage in ((4, "a"), (8, "b")):
        for i, (correct, rank) in enumerate([(True, 1), (False, 50), (False, 900), (False, None)]):
            samples.append(
                {
                    "stage": stage,
                    "step": step,
                    "task": "assistant_qa",
                    "split": "heldout",
                    "prompt": f"<|im_start|>user\nQ{i}?<|im_end|>\n<|im_start|>assistant\n",
                    "gold": "A",
                    "pred": "Yes." if not correct else "A",
                    "correct": correct,
                    "mode_ok": correct,
                    "gold_first_rank": rank,
                    "gold_first_token": "A",
                    "top5": [{"token": "Yes", "id": 5, "prob": 0.5}],
                }
            )
    (run / "samples.jsonl").write_text("\n".join(json.dumps(s) for s in samples) + "\n")
    worst = A.worst_failures(run, n=2)
    assert worst["step"].unique().to_list() == [8]
    assert worst["gold_first_rank"].to_list() == [900, 50]  # most confidently wrong first
    assert worst["failures"][0] == 3 and worst["items"][0] == 4
    assert worst["top5"][0] == "'Yes' 0.50"
    assert A.worst_failures(run, n=5, at="a")["step"].unique().to_list() == [4]
    assert A.readable_prompt(samples[0]["prompt"]) == "Q0?"
    assert (
        A.readable_prompt(
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
            "<|im_start|>user\nname?<|im_end|>\n"
        )
        == "user: hi\nassistant: hello\nuser: name?"
    )


# ----------------------------------------------------------------------------------------------------------------
# Sweeps
# ----------------------------------------------------------------------------------------------------------------


def test_simplex_groups_found_with_and_without_the_space():
    trials = make_trials(12)
    assert A.simplex_groups(trials) == {"stages[1].mixture": TASKS}
    assert A.simplex_groups(trials, {"stages[1].mixture": {"simplex": ["repeat", "yesno"]}}) == {
        "stages[1].mixture": ["repeat", "yesno"]
    }
    assert A.objective_columns(trials) == ["objective"]
    parsed = A.metric_columns(trials)
    assert parsed.filter(pl.col("stage") == "mix", pl.col("metric") == "greedy")["task"].to_list() == TASKS


def test_interference_recovers_a_known_linear_law():
    fit = A.interference(make_trials(40), "greedy", "heldout")
    assert fit.stage == "mix" and fit.path == "stages[1].mixture" and fit.n == 40
    assert fit.coef["weight"].to_list() == TASKS
    np.testing.assert_allclose(fit.coef.drop("weight").to_numpy(), LAW, atol=1e-8)
    assert all(r == pytest.approx(1.0) for r in fit.r2.values())
    assert all(r == pytest.approx(1.0) for r in fit.loo_r2.values())
    assert "good fit" in fit.quality and "stages[1].optim.lr" in fit.quality  # the unmodelled parameter is named
    # The interference matrix: +0.1 of weight i taken proportionally from the others at the mean mixture.
    mean = np.array([fit.mean_mixture[t] for t in TASKS])
    for i in range(3):
        others = np.delete(np.arange(3), i)
        expected = 0.1 * (LAW[i] - (mean[others, None] * LAW[others]).sum(axis=0) / mean[others].sum())
        np.testing.assert_allclose(fit.effect.drop("weight").to_numpy()[i], expected, atol=1e-6)
    # Raising yesno costs assistant_qa (the seesaw) and helps yesno.
    effect = {r["weight"]: r for r in fit.effect.iter_rows(named=True)}
    assert effect["yesno"]["assistant_qa"] < 0 < effect["yesno"]["yesno"]
    # Predictions follow the law; the predicted best mixture for the mean is near the best vertex (repeat).
    pred = fit.predict({"yesno": 0.2, "assistant_qa": 0.3, "repeat": 0.5})
    np.testing.assert_allclose(pred.row(0), np.array([0.2, 0.3, 0.5]) @ LAW, atol=1e-8)
    assert max(fit.best_mixture, key=fit.best_mixture.get) == "repeat"
    assert sum(fit.best_mixture.values()) == pytest.approx(1.0)
    assert fit.best_objective >= fit.best_observed["objective"] - 1e-9


def test_interference_objective_and_failures():
    trials = make_trials(40)
    fit = A.interference(trials, objective="min", over=["yesno", "assistant_qa"])
    # max over w of min(yesno, qa) for the law: an interior mixture, better than any single trial's.
    assert 0.2 < fit.best_mixture["yesno"] < 0.8 and 0.2 < fit.best_mixture["assistant_qa"] < 0.8
    assert fit.best_objective >= fit.best_observed["objective"] - 1e-6
    lower = A.interference(trials, "ft_hijack")  # lower is better: the best mixture minimises
    assert lower.maximize is False and max(lower.best_mixture, key=lower.best_mixture.get) == "repeat"
    noisy = A.interference(make_trials(40, noise=0.3), "greedy")
    assert "poor fit" in noisy.quality or "fair fit" in noisy.quality
    with pytest.raises(A.AnalysisError, match="cannot fit"):
        A.interference(make_trials(3))
    with pytest.raises(A.AnalysisError, match="no metric"):
        A.interference(trials, "tf_exact")
    pd = A.partial_dependence(fit)
    assert set(pd["weight"].unique()) == set(TASKS) and set(pd["target"].unique()) == set(TASKS)
    with pytest.raises(A.AnalysisError, match="over"):
        A.interference(trials, objective="min", over=["nope"])


def test_interference_quadratic_law():
    rng = np.random.default_rng(1)
    trials = make_trials(60)
    w = trials.filter(pl.col("state") == "COMPLETE").select([f"param/stages[1].mixture.{t}" for t in TASKS]).to_numpy()
    curved = w @ LAW[:, 0] + 2.0 * w[:, 0] * w[:, 1]
    trials = trials.with_columns(
        pl.Series("metric/mix/heldout/yesno/greedy", list(curved) + [None, None], dtype=pl.Float64)
    )
    linear = A.interference(trials, targets=["yesno"])
    quadratic = A.interference(trials, targets=["yesno"], degree=2)
    assert quadratic.r2["yesno"] == pytest.approx(1.0) and linear.r2["yesno"] < 0.999
    del rng


def test_pareto_on_known_points():
    trials = pl.DataFrame(
        {
            "number": [0, 1, 2, 3, 4, 5],
            "state": ["COMPLETE"] * 5 + ["FAIL"],
            "x": [1.0, 2.0, 3.0, 2.0, 1.0, 9.0],
            "y": [3.0, 2.0, 1.0, 1.0, 1.0, 9.0],
        }
    )
    front = A.pareto(trials, ["x", "y"])
    assert set(front.filter(pl.col("pareto"))["number"]) == {0, 1, 2}  # the FAIL trial is not a candidate
    assert front.height == 5
    mins = A.pareto(trials, ["x", "y"], directions=["min", "min"])
    assert set(mins.filter(pl.col("pareto"))["number"]) == {4}
    losses = trials.rename({"x": "metric/s/heldout/a/loss", "y": "metric/s/heldout/b/greedy"})
    auto = A.pareto(losses, ["metric/s/heldout/a/loss", "metric/s/heldout/b/greedy"])  # loss down, greedy up
    assert set(auto.filter(pl.col("pareto"))["number"]) == {0}
    with pytest.raises(A.AnalysisError, match="no column"):
        A.pareto(trials, ["x", "nope"])


def test_sweep_helpers(tmp_path):
    trials = make_trials(20)
    sweep = write_sweep(tmp_path / "sweep", trials)
    loaded = A.load_sweep(sweep)
    assert loaded.height == 22 and loaded["number"].to_list() == list(range(22))
    config = A.read_sweep_config(sweep)
    obj = A.sweep_objective(config)
    assert A.objective_directions(config, ["objective"]) == ["max"]
    assert A.objective_directions(
        {"objectives": [{"metric": "greedy"}, {"metric": "ft_hijack"}]}, ["objective_0", "objective_1"]
    ) == ["max", "min"]
    assert obj["reduce"] == "min" and obj["tasks"] == ["yesno", "assistant_qa"]
    assert A.fit_objective(obj, TASKS) == {"objective": "min", "over": ["yesno", "assistant_qa"]}
    fit = A.interference(trials, **A.fit_objective(obj, TASKS))
    assert fit.objective == "min of yesno, assistant_qa"
    assert fit.best_observed["objective"] == pytest.approx(
        trials.filter(pl.col("state") == "COMPLETE")["objective"].max()
    )  # the study's own objective
    x, y, why = A.tradeoff_pair(trials, ["objective"])
    assert {x, y} == {"metric/mix/heldout/yesno/greedy", "metric/mix/heldout/assistant_qa/greedy"}
    assert (
        A.best_trials(trials, 3)["objective"].to_list()
        == sorted(trials.filter(pl.col("state") == "COMPLETE")["objective"].to_list(), reverse=True)[:3]
    )
    assert A.best_trial_dir(trials, sweep) is None  # trial dirs do not exist
    with pytest.raises(A.AnalysisError, match="not a sweep"):
        A.load_sweep(tmp_path)
