"""Does a two-answer task (yes/no) rank its answers right even when greedy decoding sits at chance?

Greedy accuracy on a yes/no pool is a threshold at P(Yes) = P(No): a model that has learned which statements are
true but leans towards "No" scores chance. :func:`binary_choice_auc` reads the first-answer-token probabilities every
evaluation stores per item (``top5`` in ``samples.jsonl``) and measures the ranking instead: the probability that a
true item gets a higher ``P(Yes) / (P(Yes) + P(No))`` than a false one (the ROC AUC, 0.5 = no knowledge), with a
one-sided Mann–Whitney p-value and a score interval (:func:`harness.core.stats.auc_test`, the statistic the run
logs as ``choice_auc`` at every evaluation). Samples written since the run logs it carry ``choice_p``, the share
from the full logits; older ones fall back to the top-5 list.

```python
import analysis as A
A.binary_choice_auc(A.load_samples("runs/quickstart/…"), "yesno")   # per step × split: n, auc, p_value, greedy …
```
"""

from __future__ import annotations

import polars as pl

from harness.core.stats import auc_test, wilson_interval

CHOICE_SCHEMA = {
    "step": pl.Int64,
    "split": pl.Utf8,
    "n": pl.Int64,
    "n_positive": pl.Int64,
    "auc": pl.Float64,
    "auc_low": pl.Float64,
    "auc_high": pl.Float64,
    "p_value": pl.Float64,
    "greedy": pl.Float64,
    "greedy_low": pl.Float64,
    "greedy_high": pl.Float64,
    "predicted_positive": pl.Float64,
    "predicted_positive_low": pl.Float64,
    "predicted_positive_high": pl.Float64,
    "mean_p_positive": pl.Float64,
}


def positive_share(top5: list[dict], positive: str, negative: str) -> float:
    """``P(positive) / (P(positive) + P(negative))`` from an item's top-5 first tokens; a token outside the top 5
    counts as 0, and 0.5 when neither is there (no preference either way)."""
    probs = {t["token"]: t["prob"] for t in top5 or []}
    p, q = probs.get(positive, 0.0), probs.get(negative, 0.0)
    return p / (p + q) if p + q > 0 else 0.5


def binary_choice_auc(samples: pl.DataFrame, task: str, positive: str = "Yes", negative: str = "No") -> pl.DataFrame:
    """Per evaluation step × split of ``task``: ``n``, ``n_positive`` (gold answers starting with ``positive``),
    ``auc`` with its 95 % ``auc_low`` / ``auc_high`` and one-sided ``p_value`` (H1: true items rank higher),
    ``greedy`` accuracy and the share of items whose greedy answer starts with ``positive`` (``predicted_positive``),
    each with its 95 % Wilson ``_low`` / ``_high``, and the mean positive share. Steps where one class is empty are
    left out (no ranking to measure)."""
    rows = samples.filter(pl.col("task") == task)
    out = []
    for (step, split), group in sorted(rows.group_by(["step", "split"]), key=lambda kv: (kv[0][0], kv[0][1])):
        exact = group["choice_p"].to_list() if "choice_p" in group.columns else [None] * group.height
        shares = [
            p if p is not None else positive_share(t, positive, negative)
            for p, t in zip(exact, group["top5"].to_list())
        ]
        gold = [g.startswith(positive) for g in group["gold"].to_list()]
        pos = [s for s, g in zip(shares, gold) if g]
        neg = [s for s, g in zip(shares, gold) if not g]
        if not pos or not neg:
            continue
        auc = auc_test(pos, neg)
        greedy = wilson_interval(int(group["correct"].sum()), len(shares))
        answered = wilson_interval(sum(p.startswith(positive) for p in group["pred"].to_list()), len(shares))
        out.append(
            {
                "step": step,
                "split": split,
                "n": len(shares),
                "n_positive": len(pos),
                "auc": auc.auc,
                "auc_low": auc.low,
                "auc_high": auc.high,
                "p_value": auc.p_value,
                "greedy": greedy.estimate,
                "greedy_low": greedy.low,
                "greedy_high": greedy.high,
                "predicted_positive": answered.estimate,
                "predicted_positive_low": answered.low,
                "predicted_positive_high": answered.high,
                "mean_p_positive": sum(shares) / len(shares),
            }
        )
    return pl.DataFrame(out, schema=CHOICE_SCHEMA)
