"""analysis.binary_choice_auc: the yes/no ranking beside greedy accuracy — its false-alarm rate on a null where the
probabilities ignore the gold answer, and a planted effect that greedy misses (every answer "No")."""

from __future__ import annotations

import json
import random
from pathlib import Path

import polars as pl
import pytest

from analysis import binary_choice_auc, load_samples
from analysis.choice import positive_share


def _item(gold_yes: bool, p_yes: float, step: int = 10, split: str = "heldout_template") -> dict:
    pred = "Yes." if p_yes > 0.5 else "No."
    return {
        "task": "yesno",
        "step": step,
        "split": split,
        "gold": "Yes." if gold_yes else "No.",
        "pred": pred,
        "correct": pred[:2] == ("Ye" if gold_yes else "No"),
        "top5": [{"token": "Yes", "prob": p_yes}, {"token": "No", "prob": 1 - p_yes}],
    }


def test_a_no_biased_model_that_ranks_right_is_found_though_greedy_is_at_chance():
    rng = random.Random(0)
    # planted: true statements get P(Yes) 0.35-0.48, false ones 0.20-0.40 — always below 0.5, so greedy says "No"
    items = [_item(True, rng.uniform(0.35, 0.48)) for _ in range(50)] + [
        _item(False, rng.uniform(0.20, 0.40)) for _ in range(50)
    ]
    row = binary_choice_auc(pl.DataFrame(items), "yesno").row(0, named=True)
    assert row["greedy"] == 0.5 and row["predicted_positive"] == 0.0
    assert row["greedy_low"] < 0.5 < row["greedy_high"]  # n = 100: chance inside greedy's interval
    assert row["predicted_positive_low"] == 0.0 < row["predicted_positive_high"] < 0.05
    assert row["auc"] > 0.8 and row["p_value"] < 1e-6
    assert (row["n"], row["n_positive"]) == (100, 50)


def test_false_alarm_rate_on_a_null_is_near_alpha():
    rng = random.Random(1)
    alarms, trials = 0, 400
    for _ in range(trials):
        items = [_item(rng.random() < 0.5, rng.random()) for _ in range(60)]
        alarms += binary_choice_auc(pl.DataFrame(items), "yesno")["p_value"][0] < 0.05
    assert 0.02 <= alarms / trials <= 0.09, alarms / trials


def test_rows_per_step_and_split_and_one_class_pools_left_out(tmp_path):
    items = [
        _item(True, 0.9, step=5),
        _item(False, 0.1, step=5),
        _item(True, 0.2, step=5, split="heldout"),
        _item(True, 0.6, step=9),
        _item(False, 0.7, step=9),
    ]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    table = binary_choice_auc(load_samples(tmp_path), "yesno")
    assert table.select("step", "split").rows() == [(5, "heldout_template"), (9, "heldout_template")]
    assert table["auc"].to_list() == [1.0, 0.0]
    assert positive_share([{"token": "Yes", "prob": 0.3}], "Yes", "No") == 1.0
    assert positive_share([{"token": "maybe", "prob": 0.9}], "Yes", "No") == 0.5
    assert positive_share([{"token": "Yes", "prob": 0.2}, {"token": "No", "prob": 0.6}], "Yes", "No") == pytest.approx(
        0.25
    )


# ---- harness.core.stats.auc_test: the statistic behind choice_auc (run) and binary_choice_auc (analysis) ----------


def test_auc_test_on_a_null_keeps_its_false_alarm_rate_and_coverage():
    """P(Yes) independent of truth at the quickstart's pool (200 items, half true): the one-sided p < 0.05 fires in
    about 5 % of pools, and the 95 % interval covers 0.5 in about 95 %."""
    import numpy as np

    from harness.core.stats import auc_test, wilson_interval

    rng = np.random.default_rng(0)
    trials, alarms, covered = 1000, 0, 0
    for _ in range(trials):
        shares = rng.beta(2, 5, size=200)  # leaning to "No", as the quickstart's yes/no does
        result = auc_test(shares[:100], shares[100:])
        alarms += result.p_value < 0.05
        covered += result.low <= 0.5 <= result.high
    alarm = wilson_interval(alarms, trials)
    assert alarm.low <= 0.05 <= alarm.high or alarm.high < 0.05, alarm
    coverage = wilson_interval(covered, trials)
    assert coverage.low <= 0.95 <= coverage.high, coverage


def test_auc_test_finds_a_planted_ranking_that_greedy_misses():
    """True statements' P(Yes) share a little above the false ones' (the quickstart's AUC ~0.65), all below 0.5:
    found in nearly every 200-item pool."""
    import numpy as np

    from harness.core.stats import auc_test

    rng = np.random.default_rng(1)
    found = 0
    for _ in range(200):
        true = np.clip(rng.normal(0.30, 0.08, 100), 0.0, 0.49)  # every share below 0.5: greedy says "No" always
        false = np.clip(rng.normal(0.25, 0.08, 100), 0.0, 0.49)
        result = auc_test(true, false)
        found += result.p_value < 0.05 and result.low > 0.5
    assert found / 200 > 0.9, found


def test_auc_test_edges():
    from harness.core.stats import auc_test

    assert auc_test([0.9, 0.8], [0.1, 0.2])[:3:2] == (1.0, 1.0)
    assert auc_test([0.5, 0.5], [0.5, 0.5]).auc == 0.5
    empty = auc_test([], [0.1])
    assert empty.n == 1 and empty.auc != empty.auc  # NaN


# Class sizes of small yes/no pools, down to one item in a class. Replicates per ratio, and the most of them whose
# interval may lie above 0.5 under the null: a procedure at exactly the nominal one-sided 2.5 % exceeds that count
# with probability 0.1 % (the 99.9 % quantile of Binomial(replicates, 0.025), ~4.3 % of 800), so a failure is a real
# excess, not bad luck; DeLong's interval fired in ~6 % of 4:20 pools, ~14 % of 2:30, ~37 % of 1:40.
SMALL_CLASSES = [(12, 12), (4, 20), (2, 30), (1, 40)]
NULL_POOLS = 800


@pytest.mark.parametrize("positives, negatives", SMALL_CLASSES)
def test_auc_interval_lies_above_half_at_most_nominally_at_small_classes(positives, negatives):
    """Scores independent of the class: the share of pools whose 95 % interval lies above 0.5 (what the group
    report counts as "significantly above chance") is at most the one-sided 2.5 %, within the binomial bound."""
    import numpy as np
    from scipy import stats

    from harness.core.stats import auc_test

    rng = np.random.default_rng(positives * 1000 + negatives)
    above = 0
    for _ in range(NULL_POOLS):
        scores = rng.random(positives + negatives)
        above += auc_test(scores[:positives], scores[positives:]).low > 0.5
    assert above <= stats.binom.ppf(0.999, NULL_POOLS, 0.025), above


def test_perfect_separation_and_all_ties_do_not_give_a_zero_width_interval():
    from harness.core.stats import auc_test

    separated = auc_test([0.9, 0.8, 0.7], [0.1, 0.2])
    assert separated.auc == 1.0 == separated.high and 0.0 < separated.low < 0.9, separated
    flipped = auc_test([0.1, 0.2], [0.9, 0.8, 0.7])
    assert flipped.auc == 0.0 == flipped.low and 0.1 < flipped.high < 1.0, flipped
    tied = auc_test([0.5] * 4, [0.5] * 6)
    assert tied.auc == 0.5 and tied.low < 0.5 < tied.high, tied
    one = auc_test([0.9], [0.1] * 40)  # one positive, ranked first: no evidence beyond 1/41
    assert one.low < 0.5 < one.high == 1.0, one


def test_first_token_probe_logs_choice_metrics_on_two_answer_tasks():
    """The probe's choice rows from per-item P(Yes) shares: AUC with its interval, the p-value, the answered-Yes
    share and the two-choice accuracy; none for a task without two answer classes."""
    from types import SimpleNamespace

    from harness.evaluation.components import FirstToken, ItemRecord

    def record(gold_yes: bool, p: float) -> ItemRecord:
        item = SimpleNamespace(gold_ids=[11 if gold_yes else 12], task="yesno", split="heldout")
        return ItemRecord(item, gold_first_rank=1, top1_id=11, choice_ids=(11, 12), choice_p=p)

    records = [
        record(True, 0.4),
        record(True, 0.45),
        record(True, 0.3),
        record(False, 0.2),
        record(False, 0.35),
        record(False, 0.6),
    ]
    ctx = SimpleNamespace(hijack_ids=frozenset())
    probe = FirstToken()
    metrics = probe.metrics(records, None, ctx)
    assert metrics["choice_auc"] == pytest.approx(5 / 9)  # 5 of the 9 true-false pairs ranked right
    assert metrics["choice_yes"] == pytest.approx(1 / 6) and metrics["choice_acc"] == pytest.approx(2 / 6)
    n, low, high = probe.intervals(records, None, ctx)["choice_auc"]
    assert n == 6 and 0 <= low < 5 / 9 < high <= 1 and 0 < metrics["choice_auc_p"] < 1
    for r in records:
        r.choice_p = r.choice_ids = None
    assert "choice_auc" not in probe.metrics(records, None, ctx) and probe.intervals(records, None, ctx) == {}


def test_group_counts_the_seeds_whose_auc_is_significantly_above_half(tmp_path):
    from analysis.group import choice_scores

    finals = {0: (0.66, 0.58, 0.74, 1e-4), 1: (0.55, 0.47, 0.63, 0.1), 2: (0.71, 0.64, 0.78, 1e-6)}
    (tmp_path / "group.json").write_text(json.dumps({"replicates": {str(s): f"seed-{s}" for s in finals}}))
    for seed, (auc, low, high, p) in finals.items():
        run = tmp_path / f"seed-{seed}"
        run.mkdir()
        stage = {
            "metrics": {
                "heldout_template": {
                    "yesno": {"choice_auc": auc, "choice_auc_p": p, "choice_yes": 0.2},
                    "math": {"greedy": 0.9},
                }
            },
            "intervals": {"heldout_template": {"yesno": {"choice_auc": {"n": 200, "ci_low": low, "ci_high": high}}}},
        }
        (run / "summary.json").write_text(json.dumps({"stages": [stage]}))
    [row] = choice_scores(tmp_path).iter_rows(named=True)
    assert (row["split"], row["task"], row["seeds"], row["above_half_in"]) == ("heldout_template", "yesno", 3, "2/3")
    assert row["mean"] == pytest.approx((0.66 + 0.55 + 0.71) / 3) and row["t_low"] < row["mean"] < row["t_high"]


def test_quickstart_criterion_judges_yes_no_by_its_ranking_and_math_by_its_baseline():
    """The slow quickstart test's verdict on a summary: yes/no passes on its AUC whatever greedy says; math needs
    its Wilson interval above the baseline, not 0.9."""
    from tests.repo.test_quickstart_slow import criterion_misses

    def summary(auc_low: float, math_low: float) -> dict:
        metrics = {
            "heldout": {"math": {"greedy": 0.85}, "repeat": {"greedy": 0.4}},
            "heldout_template": {
                "yesno": {"greedy": 0.5, "choice_auc": 0.65, "choice_auc_p": 1e-4},
                "short_qa": {"greedy": 0.15},
                "assistant_qa": {"greedy": 0.3},
            },
        }
        ci = {"n": 200, "ci_high": 0.9}
        intervals = {
            "heldout": {"math": {"greedy": {**ci, "ci_low": math_low}}, "repeat": {"greedy": {**ci, "ci_low": 0.33}}},
            "heldout_template": {
                "yesno": {"choice_auc": {**ci, "ci_low": auc_low}},
                "short_qa": {"greedy": {**ci, "ci_low": 0.1}},
                "assistant_qa": {"greedy": {**ci, "ci_low": 0.24}},
            },
        }
        base = [{"metric": "greedy", "value": 0.05}]
        baselines = {
            "heldout": {"math": [{"metric": "greedy", "value": 0.02}], "repeat": base},
            "heldout_template": {"yesno": [{"metric": "greedy", "value": 0.5}], "short_qa": base, "assistant_qa": base},
        }
        return {"stages": [{"metrics": metrics, "intervals": intervals}], "baselines": baselines}

    assert criterion_misses(summary(auc_low=0.58, math_low=0.79)) == []  # math 0.85 < 0.9: still a pass
    [miss] = criterion_misses(summary(auc_low=0.49, math_low=0.79))
    assert miss.startswith("yesno heldout_template: choice_auc 0.650 [0.490")
    [miss] = criterion_misses(summary(auc_low=0.58, math_low=0.01))
    assert miss.startswith("math heldout: greedy 0.850")
    # short_qa is judged in every seed (issue 41; it was seed 0 only): an interval reaching its baseline is a miss
    weak = summary(auc_low=0.58, math_low=0.79)
    weak["stages"][0]["intervals"]["heldout_template"]["short_qa"]["greedy"]["ci_low"] = 0.04
    [miss] = criterion_misses(weak)
    assert miss.startswith("short_qa heldout_template: greedy 0.150 [0.040")


def test_quickstart_shows_the_hijack_and_a_seesaw_event_or_says_which_is_missing(tmp_path):
    """The slow quickstart test's second verdict: an open question's first token taken by yes/no (the Wilson lower
    bound of ft_hijack on heldout_template at least 0.1 at some evaluation) and a seesaw event, per replicate."""
    from tests.repo.test_quickstart_slow import HIJACK_LOW, shown_misses

    def run(low: float) -> Path:
        rows = [
            {"step": step, "task": task, "split": "heldout_template", "metric": "ft_hijack", "ci_low": value}
            for step, value in ((200, 0.0), (300, low), (600, low / 2))
            for task in ("short_qa", "assistant_qa")
        ] + [{"step": 300, "task": "yesno", "split": "heldout_template", "metric": "ft_hijack", "ci_low": 0.9}]
        out = tmp_path / f"run-{low}"
        out.mkdir()
        pl.DataFrame(rows).write_parquet(out / "metrics.parquet")
        return out

    event = {"seesaw_events": [{"metric": "greedy", "rose": "yesno", "fell": "assistant_qa"}]}
    assert shown_misses(event, run(HIJACK_LOW + 0.05)) == []
    [miss] = shown_misses(event, run(HIJACK_LOW - 0.05))  # yes/no's own answers starting with yes/no do not count
    assert miss.startswith("no first-token hijack")
    assert shown_misses({"seesaw_events": []}, run(0.3)) == ["no seesaw event"]
