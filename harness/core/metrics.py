"""The metric contract's names that every layer and ``analysis`` share: which metrics are proportions (stored
with ``n`` and a Wilson interval, tested with exact McNemar), how baseline and seesaw
rows are named, and the file that marks a seed group
(which metrics are better when lower: :data:`harness.core.store.LOWER_IS_BETTER`).
"""

from __future__ import annotations

#: Metrics that are a share of items (mean of a 0/1 outcome per item): stored with ``n`` and a Wilson interval, and
#: tested with exact McNemar in the seesaw. Not ``ft_top1``: its "success" (the most common top-1 token) is picked
#: after looking at the data, so a binomial interval around it would be too narrow.
PROPORTION_METRICS = frozenset({"greedy", "answer_ok", "truncated", "mode_ok", "tf_first", "tf_exact", "ft_hijack",
                                "ft_nonfinite"})

#: A baseline row's metric is this prefix and the metric it is a baseline of (``baseline_greedy``).
BASELINE_PREFIX = "baseline_"
#: Run-level row: how many paired tests the run's seesaw made (text: the rule).
SEESAW_TESTS_METRIC = "seesaw_tests"

#: The file at the top of a seed group's directory (``harness run --seeds``).
GROUP_FILE = "group.json"
