"""The quickstart is a default that learns (issue 14, item 3; the criterion of issue 31, tightened in issue 41):
``experiments/quickstart.yaml`` exactly as shipped, run as a seed group (``--seeds 0,1,2``: the same task data,
three trainings, each pretraining its own base), ends, at the last evaluation, **in every seed**:

- with yes/no's *ranking* learned on ``heldout_template`` (trained people, unseen phrasings): ``choice_auc`` — the
  AUC of P(Yes) / (P(Yes) + P(No)) at the first answer token between true and false statements — significantly
  above 0.5 (its 95 % score interval wholly above 0.5). Greedy accuracy is that ranking cut at P(Yes) = P(No),
  whose threshold swings between evaluations; it is reported, not judged;
- with reversed 2-digit addition (``heldout``: held-out number pairs), ``repeat`` (heldout) and the open knowledge
  tasks ``short_qa`` and ``assistant_qa`` (heldout_template) significantly above their baselines: the Wilson 95 %
  interval of greedy accuracy wholly above the pool's constant-answer baseline (before issue 41 the last three
  were judged in seed 0 only). Math greedy >= 0.9 stays the reported aim (printed), not a pass condition.

And what the quickstart exists to show, in every seed: the first-token hijack — at some evaluation, an open
question's (``short_qa``, ``assistant_qa``) most likely first answer token is yes/no in a share whose Wilson lower
bound is at least 0.1 (heldout_template; before yes/no is trained it is 0) — and at least one seesaw event found by
the run's paired test (BH over all of the run's tests; the forgetting probe's reference text counts as a task that
falls, as in the run's own report).

The knowledge tasks' ``heldout`` split asks about people never seen in SFT, whose facts the tiny base saw only in
pretraining; the quickstart does not claim those. Minutes per seed on 2 CPU cores (docs/quickstart.md); a miss here
is a finding about the default, to report, not a threshold to loosen."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

SEEDS = (0, 1, 2)
SPLIT = {
    "repeat": "heldout",
    "math": "heldout",
    "short_qa": "heldout_template",
    "assistant_qa": "heldout_template",
    "yesno": "heldout_template",
}
GREEDY_TASKS = ("math", "repeat", "short_qa", "assistant_qa")  # greedy against the baseline, every seed
CHOICE_TASK = "yesno"  # judged by its ranking (choice_auc) in every seed
HIJACKED = ("short_qa", "assistant_qa")  # open answers whose first token yes/no can take
HIJACK_LOW = 0.1  # the Wilson lower bound of the hijacked share at its height
MATH_AIM = 0.9


def _baseline(summary: dict, split: str, task: str) -> float:
    """The pool's greedy baseline: its constant answer's accuracy (for yes/no also chance, 0.5; the larger)."""
    return max(b["value"] for b in summary["baselines"][split][task] if b["metric"] == "greedy")


@pytest.mark.slow
def test_quickstart_learns_every_task(tmp_path):
    out = tmp_path / "group"
    env = {"HARNESS_CACHE": str(tmp_path / "cache")}  # a cold cache: the pretrained base too
    result = run_cli(
        "run",
        "experiments/quickstart.yaml",
        "--seeds",
        ",".join(map(str, SEEDS)),
        "--out",
        str(out),
        env=env,
        timeout=3600 * len(SEEDS),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summaries = {s: json.loads((out / f"seed-{s}" / "summary.json").read_text()) for s in SEEDS}
    tasks = set(summaries[0]["stages"][-1]["metrics"]["heldout"]) - {"identity"}
    assert tasks == set(SPLIT), f"the quickstart's tasks changed: {sorted(tasks)}; update SPLIT"
    for seed, summary in summaries.items():
        print(f"seed {seed}: " + "; ".join(reported(summary)))
    misses = [
        f"seed {seed}: {miss}"
        for seed, summary in summaries.items()
        for miss in criterion_misses(summary) + shown_misses(summary, out / f"seed-{seed}")
    ]
    assert not misses, "; ".join(misses)


def _greedy_miss(summary: dict, task: str) -> str | None:
    split = SPLIT[task]
    final = summary["stages"][-1]
    ci = final["intervals"][split][task]["greedy"]  # the run's own 95 % Wilson interval and n
    greedy = final["metrics"][split][task]["greedy"]
    base = _baseline(summary, split, task)
    if ci["ci_low"] > base:
        return None
    return (
        f"{task} {split}: greedy {greedy:.3f} [{ci['ci_low']:.3f}, {ci['ci_high']:.3f}] (n = {ci['n']}) vs "
        f"baseline {base:.3f}"
    )


def _choice_miss(summary: dict, task: str = CHOICE_TASK) -> str | None:
    split = SPLIT[task]
    final = summary["stages"][-1]
    values = final["metrics"][split][task]
    if "choice_auc" not in values:
        return f"{task} {split}: no choice_auc logged (is the first_token probe on?)"
    ci = final["intervals"][split][task]["choice_auc"]  # 95 % score interval
    if ci["ci_low"] > 0.5:
        return None
    return (
        f"{task} {split}: choice_auc {values['choice_auc']:.3f} [{ci['ci_low']:.3f}, {ci['ci_high']:.3f}] "
        f"(n = {ci['n']}, p = {values['choice_auc_p']:.2g}) not above 0.5"
    )


def criterion_misses(summary: dict) -> list[str]:
    """One line per miss of the criterion (module docstring) in one replicate's ``summary.json``."""
    misses = [_greedy_miss(summary, task) for task in GREEDY_TASKS] + [_choice_miss(summary)]
    return [m for m in misses if m is not None]


def shown_misses(summary: dict, run_dir) -> list[str]:
    """What the quickstart must show (module docstring) and one replicate did not: the hijack, a seesaw event."""
    from harness.core.store import read_metrics

    misses = []
    frame = read_metrics(run_dir)
    rows = frame.filter(
        (frame["metric"] == "ft_hijack") & (frame["split"] == "heldout_template") & frame["task"].is_in(HIJACKED)
    )
    lows = rows["ci_low"].drop_nulls().to_list()  # each evaluation's Wilson interval, as the run logged it
    if not lows or max(lows) < HIJACK_LOW:
        misses.append(f"no first-token hijack: largest lower bound {max(lows, default=0):.3f} < {HIJACK_LOW}")
    if not summary.get("seesaw_events"):
        misses.append("no seesaw event")
    return misses


def reported(summary: dict) -> list[str]:
    """What the test prints beside its verdict: yes/no greedy (not judged) and math against the 0.9 aim."""
    final = summary["stages"][-1]
    out = []
    for task, metric in ((CHOICE_TASK, "greedy"), (CHOICE_TASK, "choice_yes"), ("math", "greedy")):
        split = SPLIT[task]
        ci = final["intervals"][split][task].get(metric, {})
        value = final["metrics"][split][task].get(metric)
        if value is not None:
            out.append(
                f"{task} {split} {metric} {value:.3f} [{ci.get('ci_low', float('nan')):.2f}, "
                f"{ci.get('ci_high', float('nan')):.2f}]"
            )
    math_greedy = final["metrics"]["heldout"]["math"]["greedy"]
    out.append(f"math aim >= {MATH_AIM}: {'met' if math_greedy >= MATH_AIM else 'not met'}")
    return out
