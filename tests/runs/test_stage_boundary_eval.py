"""A stage that starts from the previous stage's weights (``init: previous``) is not evaluated again: the rows of
the previous stage's last evaluation are recorded under its name at the same step (store, history, per-item
outcomes for the seesaw), and the evaluators run once per distinct set of weights."""

from __future__ import annotations

from harness.config import load_experiment
from harness.core.store import read_metrics
from harness.runs.execution import evallog
from harness.runs.execution.runner import run_experiment
from tests.conftest import write_yaml


def _counted(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = evallog.run_evaluation

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(evallog, "run_evaluation", counting)
    return calls


def test_init_previous_reuses_the_last_evaluation(tiny, tmp_path, monkeypatch):
    tiny["stages"].append({"name": "c", "steps": 4, "init": "base", "mixture": {"yesno": 1.0}})
    tiny["train"]["stage_cache"] = False  # every stage computed here, none replayed
    calls = _counted(monkeypatch)
    exp = load_experiment(write_yaml(tmp_path / "x.yaml", tiny))
    result = run_experiment(exp, tmp_path / "run")
    # a: steps 0 and 4; b (init previous) at 4 is a's evaluation, then 8; c (init base) at 8 is new weights, then 12
    assert len(calls) == 5
    frame = read_metrics(tmp_path / "run")
    frame = frame.filter(frame["split"] == "heldout")  # the evaluation rows (tiny evaluates heldout only)
    at = {
        (stage, step): frame.filter((frame["stage"] == stage) & (frame["step"] == step))
        .sort(["task", "split", "metric"])
        .select(["task", "split", "metric", "value", "n"])
        for stage, step in [("a", 4), ("b", 4), ("b", 8), ("c", 8)]
    }
    assert at[("a", 4)].height > 0 and at[("a", 4)].equals(at[("b", 4)])  # the start of b, as the seesaw needs it
    assert at[("c", 8)].height == at[("b", 8)].height  # c's start is evaluated afresh (other weights)
    assert [s["start_step"] for s in result.summary["stages"]] == [0, 4, 8]


def test_the_seesaw_outcomes_include_the_repeated_start(tiny, tmp_path, monkeypatch):
    """The per-item outcomes the paired seesaw test reads hold stage b's start (copied, not recomputed)."""
    seen = {}
    real = evallog.EvalLog.repeat_last

    def spy(self, stage):
        real(self, stage)
        seen[stage] = [o for o in self.outcomes if o["stage"] == stage]

    monkeypatch.setattr(evallog.EvalLog, "repeat_last", spy)
    tiny["train"]["stage_cache"] = False
    exp = load_experiment(write_yaml(tmp_path / "x.yaml", tiny))
    run_experiment(exp, tmp_path / "run")
    assert seen["b"] and all(o["step"] == 4 for o in seen["b"])
