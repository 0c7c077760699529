"""Metrics declare themselves (issue 51, item 5): a component's ``emits`` gives each metric its kind and direction,
and every consumer reads the declarations — so a plug-in's 0/1 metric gets ``n`` and a Wilson interval in
``metrics.parquet``, its per-item outcomes in ``samples.jsonl`` (and so exact McNemar in the paired seesaw test), and
a plug-in's lower-is-better metric gives a sweep objective its default direction."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness.core import metrics as metric_module
from harness.core import plugins as plugin_imports
from harness.core.metrics import METRICS, PROPORTION_METRICS, continuous, declare_metric, proportion
from harness.core.registry import PLUGIN_REGISTRIES
from harness.core.store import LOWER_IS_BETTER
from tests.conftest import TINY, write_yaml

PLUGIN = """
from harness.core.metrics import continuous, proportion
from harness.core.registry import EVALUATORS
from harness.evaluation.components import NEED_GREEDY, Component


@EVALUATORS.plugin("digit_start")
class DigitStart(Component):
    needs = frozenset({NEED_GREEDY})
    emits = (proportion("starts_with_digit"), continuous("answer_chars", higher_is_better=False))

    def item_values(self, records, recipe, ctx):
        return {"starts_with_digit": [float((r.pred or "")[:1].isdigit()) for r in records]}

    def metrics(self, records, recipe, ctx):
        starts = self.item_values(records, recipe, ctx)["starts_with_digit"]
        return {
            "starts_with_digit": sum(starts) / len(starts),
            "answer_chars": sum(len(r.pred or "") for r in records) / len(records),
        }
"""


@pytest.fixture(autouse=True)
def _registries_restored(monkeypatch):
    """The plug-in's components and metric declarations are forgotten after each test."""
    registries = {**PLUGIN_REGISTRIES, "metrics": METRICS}
    for registry in registries.values():
        registry.names()  # providers imported before the snapshot
    saved = {kind: dict(registry._items) for kind, registry in registries.items()}
    monkeypatch.setattr(plugin_imports, "_imported", dict(plugin_imports._imported))
    modules = set(sys.modules)
    yield
    for kind, registry in registries.items():
        registry._items.clear()
        registry._items.update(saved[kind])
    for name in set(sys.modules) - modules:
        if name.startswith("harness_plugin_"):
            del sys.modules[name]


def _experiment(tmp_path: Path) -> Path:
    (tmp_path / "digit_plugin.py").write_text(PLUGIN)
    data = json.loads(json.dumps(TINY))
    data["plugins"] = [str(tmp_path / "digit_plugin.py")]
    data["tasks"] = {k: v for k, v in data["tasks"].items() if k in ("repeat", "math")}
    data["eval"] = {**data["eval"], "evaluators": ["greedy", "digit_start"], "probes": []}
    data["stages"] = [{"name": "a", "steps": 4, "mixture": {"repeat": 0.5, "math": 0.5}}]
    return write_yaml(tmp_path / "tiny.yaml", data)


def test_every_metric_a_builtin_component_emits_is_declared_and_the_sets_are_derived():
    from harness.core.registry import EVALUATORS, PROBES

    for registry in (EVALUATORS, PROBES):
        for name in registry.names():
            assert set(registry.get(name).metric_names) <= set(METRICS.names()), name
    assert {"greedy", "answer_ok", "mode_ok", "tf_first", "tf_exact", "ft_hijack", "choice_acc"} <= PROPORTION_METRICS
    assert "ft_top1" not in PROPORTION_METRICS and "eval_loss" not in PROPORTION_METRICS
    assert {"loss", "eval_loss", "ft_rank_median", "ft_hijack", "ref_loss"} <= LOWER_IS_BETTER
    assert "greedy" not in LOWER_IS_BETTER and "ref_loss_base" not in LOWER_IS_BETTER
    declare_metric("my_error_rate", "proportion", higher_is_better=False)  # a declaration counts at once
    assert "my_error_rate" in PROPORTION_METRICS and "my_error_rate" in LOWER_IS_BETTER
    assert PROPORTION_METRICS | {"x"} == frozenset(PROPORTION_METRICS) | {"x"}  # set operations give plain sets


def test_a_recipes_extra_scores_are_declared_proportions():
    from data_recipes import Recipe

    class Scored(Recipe):  # a plug-in recipe whose extra_scores give "answer_starts_right" per item
        extra_metrics = ("answer_starts_right",)

        def build(self, task, n_train, n_eval, seed):  # pragma: no cover - not built here
            return {}

    assert Scored.extra_metrics and "answer_starts_right" in PROPORTION_METRICS


def test_a_metric_declared_twice_differently_is_refused():
    declare_metric("twice", "proportion")
    declare_metric("twice", "proportion")  # alike: fine (two components may emit the same metric)
    with pytest.raises(ValueError, match="'twice' declared twice"):
        declare_metric("twice", "continuous")
    with pytest.raises(ValueError, match="kind 'ratio'"):
        metric_module.Metric("x", "ratio")
    assert METRICS.spec("never_declared") == continuous("never_declared")  # the default: continuous, higher
    assert proportion("p").kind == "proportion"


def test_a_plugin_proportion_gets_its_interval_outcomes_and_mcnemar(tmp_path):
    from harness.config import load_experiment
    from harness.core.seesaw import change_tests
    from harness.core.store import read_metrics
    from harness.runs.execution.runner import run_experiment

    run_dir = tmp_path / "run"
    run_experiment(load_experiment(_experiment(tmp_path)), run_dir)

    store = read_metrics(run_dir)
    rows = store.filter(store["metric"] == "starts_with_digit")
    assert len(rows) > 0 and rows["n"].is_not_null().all() and (rows["n"] == 4).all()
    assert (rows["ci_low"] <= rows["value"]).all() and (rows["value"] <= rows["ci_high"]).all()
    chars = store.filter(store["metric"] == "answer_chars")
    assert len(chars) > 0 and chars["n"].is_null().all()  # continuous: no Wilson interval
    from analysis.loading import load_run
    from analysis.report.evidence import stage_end_intervals

    shown = stage_end_intervals(load_run(run_dir), "starts_with_digit", "heldout")  # the report's stage table
    assert set(shown) == {("a", "repeat"), ("a", "math")}

    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert all(s["outcomes"]["starts_with_digit"] in (0, 1) for s in samples)
    # the stored outcomes are what the paired seesaw test reads: two evaluations of one task, exact McNemar
    outcome_rows = {}
    for s in samples:
        key = (s["step"], s["stage"], s["task"], s["split"])
        outcome_rows.setdefault(key, []).append(s["outcomes"]["starts_with_digit"])
    tests = change_tests(
        [
            {"step": step, "stage": stage, "task": task, "split": split, "metric": "starts_with_digit", "outcomes": v}
            for (step, stage, task, split), v in outcome_rows.items()
        ],
        ["starts_with_digit"],
    )
    assert tests and {t["test"] for t in tests} == {"mcnemar"}


def test_a_plugin_lower_is_better_metric_sets_a_sweep_objective_direction(tmp_path):
    from analysis import lower_is_better
    from harness.studies.sweep import load_sweep

    _experiment(tmp_path)
    sweep = {
        "experiment": "tiny.yaml",
        "study": {"name": "chars", "sampler": "random", "n_trials": 2, "seed": 0},
        "space": {"stages.a.mixture": {"simplex": ["repeat", "math"]}},
        "objective": {"metric": "answer_chars", "split": "heldout"},
    }
    loaded = load_sweep(write_yaml(tmp_path / "sweep.yaml", sweep))
    assert [o.direction for o in loaded.objectives] == ["minimize"]  # no direction written: the declaration's
    assert lower_is_better("metric/a/heldout/math/answer_chars") and not lower_is_better("starts_with_digit")
    sweep["objective"] = {"metric": "starts_with_digit", "split": "heldout"}
    assert [o.direction for o in load_sweep(write_yaml(tmp_path / "sweep.yaml", sweep)).objectives] == ["maximize"]


def test_a_group_report_takes_a_metric_with_stored_outcomes_for_a_proportion():
    from analysis.group import _across

    # the analysis process need not import the plug-in: the runs stored per-item outcomes only for proportions
    outcomes = {0: {0: 1.0, 1: 0.0, 2: 1.0}, 1: {0: 1.0, 1: 1.0, 2: 1.0}}
    assert _across("starts_with_digit", {0: 2 / 3, 1: 1.0}, outcomes, 3)[1] == "seeds × items"
    assert _across("answer_chars", {0: 3.0, 1: 4.0}, {}, 3)[1] == "t over seeds"
