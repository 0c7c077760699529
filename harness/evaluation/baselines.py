"""What a score means against a model that ignores its input: baselines of one task × split's eval pool.

Pure functions of the pool's gold answers (and gold first-token ids) and the task's recipe — no model, no torch —
computed once at run start (phase 2 wires them into ``summary.json``, the store as ``baseline_<metric>``, and the
report's dashed lines):

- **constant answer** (:func:`constant_answer_baseline`): the best single answer given to every prompt. Every
  distinct gold answer of the pool is tried, plus the recipe's closed answer classes (yes/no), and scored with the
  recipe's own ``is_correct`` — so identity (one gold answer) scores 1.0 and yes/no scores its majority share. The
  winner's ``mode_ok`` and extra scores (math's ``answer_ok``) are its baselines for those metrics;
- **majority first token** (:func:`majority_first_token_baseline`): ``tf_first`` of a model that always puts the
  pool's most common gold first token on top ("R" for every math answer, "I" for identity);
- **chance** (:func:`chance_baseline`): uniform guessing among the recipe's answer classes (yes/no: 0.5); none for
  open answers.

:func:`task_baselines` gathers them; :func:`strongest_baselines` keeps, per metric, the highest — the one a final
score must beat (:func:`harness.core.stats.above_rate_p`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CONSTANT = "constant_answer"
MAJORITY_FIRST_TOKEN = "majority_first_token"
CHANCE = "chance"


@dataclass(frozen=True)
class Baseline:
    """One baseline of one metric: ``value`` over ``n`` pool items, what it comes from (``kind``) and the answer
    or first-token id that achieves it (None for chance)."""

    metric: str
    kind: str
    value: float
    n: int
    answer: Any = None


def constant_answer_baseline(golds: Sequence[str], recipe: Any) -> list[Baseline]:
    """The best constant answer on the pool ``golds``: ``greedy`` (its share judged correct by
    ``recipe.is_correct``), plus ``mode_ok`` and each ``recipe.extra_scores`` metric *of that same answer*.

    Candidates: the recipe's ``answer_classes()`` then the pool's distinct gold answers, in pool order; ties go to
    the first candidate. Empty pool: no baselines."""
    if not golds:
        return []
    candidates = list(dict.fromkeys([*recipe.answer_classes(), *golds]))
    n = len(golds)
    scored = [(hits / n, c) for hits, c in zip(_hits(candidates, golds, recipe), candidates)]
    best_score = max(score for score, _ in scored)
    best = next(c for score, c in scored if score == best_score)
    out = [
        Baseline("greedy", CONSTANT, best_score, n, best),
        Baseline("mode_ok", CONSTANT, float(bool(recipe.mode_ok(best))), n, best),
    ]
    extra: dict[str, int] = {}
    for gold in golds:
        for metric, ok in recipe.extra_scores(best, gold).items():
            extra[metric] = extra.get(metric, 0) + bool(ok)
    out += [Baseline(metric, CONSTANT, hits / n, n, best) for metric, hits in extra.items()]
    return out


def _hits(candidates: Sequence[str], golds: Sequence[str], recipe: Any) -> list[int]:
    """For each candidate, how many golds ``recipe.is_correct`` accepts it for — counted per distinct gold (or per
    normal form, when the recipe keeps the default ``is_correct``: equal normal forms), not candidate × item: the
    same integers, without the quadratic number of calls (every eval pool of every run)."""
    from data_recipes.base import Recipe

    counts = Counter(golds)
    if type(recipe).is_correct is Recipe.is_correct:
        normal: Counter = Counter()
        for gold, k in counts.items():
            normal[recipe.normalise(gold)] += k
        return [normal[recipe.normalise(c)] for c in candidates]
    return [sum(k for gold, k in counts.items() if recipe.is_correct(c, gold)) for c in candidates]


def majority_first_token_baseline(gold_first_ids: Sequence[int | None]) -> list[Baseline]:
    """``tf_first`` of always predicting the most common gold first token (ties: the smallest id) over the items
    that have a gold first token; empty when none has."""
    ids = [i for i in gold_first_ids if i is not None]
    if not ids:
        return []
    token, count = min(Counter(ids).items(), key=lambda kv: (-kv[1], kv[0]))
    return [Baseline("tf_first", MAJORITY_FIRST_TOKEN, count / len(ids), len(ids), token)]


def chance_baseline(golds: Sequence[str], recipe: Any) -> list[Baseline]:
    """``greedy`` of guessing uniformly among the recipe's answer classes (1 / number of classes, whatever the
    pool's balance); empty for open-answer tasks."""
    classes = recipe.answer_classes()
    if not classes or not golds:
        return []
    return [Baseline("greedy", CHANCE, 1 / len(classes), len(golds))]


def task_baselines(golds: Sequence[str], gold_first_ids: Sequence[int | None], recipe: Any) -> list[Baseline]:
    """Every baseline of one task × split pool: constant answer, majority first token, chance."""
    return [
        *constant_answer_baseline(golds, recipe),
        *majority_first_token_baseline(gold_first_ids),
        *chance_baseline(golds, recipe),
    ]


def strongest_baselines(baselines: Sequence[Baseline]) -> dict[str, Baseline]:
    """``{metric: the baseline with the highest value}`` (the first one on ties)."""
    out: dict[str, Baseline] = {}
    for b in baselines:
        if b.metric not in out or b.value > out[b.metric].value:
            out[b.metric] = b
    return out
