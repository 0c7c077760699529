"""The metric contract's names that every layer and ``analysis`` share: which metrics are proportions (stored
with ``n`` and a Wilson interval, tested with exact McNemar), how baseline and seesaw
rows are named, and the file that marks a seed group
(which metrics are better when lower: :data:`harness.core.store.LOWER_IS_BETTER`).
"""

from __future__ import annotations

#: Metrics that are a share of items (mean of a 0/1 outcome per item): stored with ``n`` and a Wilson interval, and
#: tested with exact McNemar in the seesaw. Not ``ft_top1``: its "success" (the most common top-1 token) is picked
#: after looking at the data, so a binomial interval around it would be too narrow.
PROPORTION_METRICS = frozenset(
    {
        "greedy",
        "answer_ok",
        "truncated",
        "mode_ok",
        "tf_first",
        "tf_exact",
        "ft_hijack",
        "ft_nonfinite",
        "choice_yes",
        "choice_acc",
    }
)

#: The binary-choice metrics of two-answer tasks (yes/no), from the first-answer-position logits of the two answers'
#: first tokens (the ``first_token`` probe): ``choice_auc`` (ROC AUC of P(first class) / (P(first) + P(second))
#: between items whose gold is the first class and the others; ``n``, 95 % score interval), ``choice_auc_p`` (its
#: one-sided Mann–Whitney p-value, H1: AUC > 0.5), ``choice_yes`` (share of items where the first class — "Yes" —
#: is the likelier of the two) and ``choice_acc`` (share where the likelier one is the gold one).
CHOICE_METRICS = ("choice_auc", "choice_auc_p", "choice_yes", "choice_acc")

#: lm-evaluation-harness benchmarks (``eval.benchmarks``) are rows like any task's: task ``bench:<lm-eval task>``,
#: split ``bench``, metric the lm-eval metric's name (``acc``, ``exact_match``, ...).
BENCH_TASK_PREFIX = "bench:"
BENCH_SPLIT = "bench"


def is_benchmark_task(task: str | None) -> bool:
    return task is not None and task.startswith(BENCH_TASK_PREFIX)


#: A baseline row's metric is this prefix and the metric it is a baseline of (``baseline_greedy``).
BASELINE_PREFIX = "baseline_"
#: Run-level row: how many paired tests the run's seesaw made (text: the rule).
SEESAW_TESTS_METRIC = "seesaw_tests"

#: The file at the top of a seed group's directory (``harness run --seeds``).
GROUP_FILE = "group.json"
