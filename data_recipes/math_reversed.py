"""``math_reversed``: the seed's arithmetic in its formal format with digit spacing — "1 2 + 7 =" →
"R 9 1 ; A 1 9" (R: the result's digits reversed, low digit first, as one computes; A: the result) — or, for
comparison, the plain format "12 + 7 =" → "19".

An item is an operand pair; for "+" a pair and its commuted twin are one item (both orders stay on one side of
the split). Held-out items are pairs never trained on; held-out templates wrap trained pairs in new wording
("Compute 1 2 + 7 =").

Scoring: ``greedy`` is exact match of the whole answer after normalising whitespace (formal: the R part and the A
part; plain: the number), so "garbage A 1 9 more" is wrong. ``answer_ok`` (:meth:`MathReversed.extra_scores`) is
the formal format's A part alone — a well-formed answer whose R part is wrong but whose A part is right — so the
two together tell a model that cannot reverse digits from one that cannot add.
"""

from __future__ import annotations

import random
import re
from typing import Literal

from pydantic import Field

from data_recipes._registry import register
from data_recipes._split import Template, check_splits, round_robin, templates
from data_recipes.base import Example, Recipe, RecipeParams

TRAIN = templates("t", ("{a} {op} {b} =",))  # the seed's bare format
HELDOUT = templates("h", ("Compute {a} {op} {b} =", "What is {a} {op} {b} ?", "Calculate: {a} {op} {b} ="))

_FORMAL = re.compile(r"^R( \d)+ ; A( \d)+$")
# A whole formal answer after normalise_spaces; spaces between digits and around ";" optional ("A 19" = "A 1 9").
_FORMAL_PARTS = re.compile(r"^R ?(\d(?: ?\d)*) ?; ?A ?(\d(?: ?\d)*)$")
_PLAIN = re.compile(r"^\d+$")
ENUMERATE_LIMIT = 600_000  # up to 3 digits every pair is enumerated; beyond, pairs are sampled


class Params(RecipeParams):
    digits: int = Field(2, ge=1, le=6, description="Most digits per operand (operands 0 .. 10^digits - 1).")
    op: Literal["+", "-"] = Field("+", description='"+" or "-" ("-" only with non-negative results: a >= b).')
    format: Literal["formal", "plain"] = Field(
        "formal", description='"formal": "1 2 + 7 =" → "R 9 1 ; A 1 9"; "plain": "12 + 7 =" → "19".'
    )


def spaced(n: int | str) -> str:
    return " ".join(str(n))


def normalise_spaces(text: str) -> str:
    """Runs of whitespace as one space, no surrounding space, a final "." dropped ("R 9 1 ;  A 1 9." →
    "R 9 1 ; A 1 9")."""
    return re.sub(r"\s+", " ", text).strip().rstrip(".").strip()


def parse_formal(text: str) -> tuple[str, int] | None:
    """``(R digits as written, A number)`` of a whole formal answer "R d d ; A d d", or ``None`` when the text is
    anything else (text around the answer included). Spacing between digits is not judged (``mode_ok`` does)."""
    m = _FORMAL_PARTS.match(normalise_spaces(text))
    return (m.group(1).replace(" ", ""), int(m.group(2).replace(" ", ""))) if m else None


def parse_plain(text: str) -> int | None:
    """The bare number (a final "." allowed), or ``None``."""
    text = text.strip().rstrip(".").strip()
    return int(text) if _PLAIN.match(text) else None


@register("math_reversed")
class MathReversed(Recipe):
    Params = Params
    extra_metrics = ("answer_ok",)

    def _count(self) -> int:
        top = 10**self.params.digits
        return top * (top + 1) // 2  # canonical pairs, the same count for "+" (a <= b) and "-" (a >= b)

    def _canonical(self, a: int, b: int) -> tuple[int, int]:
        return (min(a, b), max(a, b)) if self.params.op == "+" else (max(a, b), min(a, b))

    def _items(self, rng: random.Random, n: int) -> list[tuple[int, int]]:
        """Canonical pairs in seeded random order: all of them when few, else ``n`` distinct random ones."""
        top = 10**self.params.digits
        if self._count() <= ENUMERATE_LIMIT:
            if self.params.op == "+":
                items = [(a, b) for a in range(top) for b in range(a, top)]
            else:
                items = [(a, b) for a in range(top) for b in range(a + 1)]
            rng.shuffle(items)
            return items
        out: dict[tuple[int, int], None] = {}
        while len(out) < n:
            out[self._canonical(rng.randrange(top), rng.randrange(top))] = None
        return list(out)

    def _orders(self, item: tuple[int, int]) -> list[tuple[int, int]]:
        a, b = item
        return [(a, b), (b, a)] if self.params.op == "+" and a != b else [(a, b)]

    def build(self, task: str, n_train: int, n_eval: int, seed: int) -> dict[str, list[Example]]:
        p = self.params
        rng = random.Random(f"{self.name}:{seed}")
        items = self._items(rng, n_train + n_eval)
        heldout_pool, train_pool = items[:n_eval], items[n_eval:]
        capacity = sum(len(self._orders(i)) for i in train_pool)
        if n_eval > len(items) or n_train > capacity:
            orders = sum(len(self._orders(i)) for i in items)
            raise ValueError(
                f"{task}: {n_train} train + {n_eval} heldout examples asked for, but digits={p.digits} op={p.op!r} "
                f"has only {len(items)} distinct operand pairs ({orders} counting both orders of a sum); "
                "lower the sizes or raise digits"
            )

        def render(pair: tuple[int, int], template: Template) -> Example:
            a, b = pair
            result = a + b if p.op == "+" else a - b
            if p.format == "formal":
                prompt = template.render(a=spaced(a), op=p.op, b=spaced(b))
                gold = f"R {spaced(str(result)[::-1])} ; A {spaced(result)}"
            else:
                prompt = template.render(a=a, op=p.op, b=b)
                gold = str(result)
            key = f"{min(a, b)}{p.op}{max(a, b)}" if p.op == "+" else f"{a}{p.op}{b}"
            return Example.single(task, prompt, gold, item=key, template=template.id, a=a, b=b, op=p.op, result=result)

        def combos(tmpl):
            return lambda item: [(order, t) for order in self._orders(item) for t in tmpl]

        train = round_robin(rng, train_pool, combos(TRAIN), n_train, f"{task}: train ({len(train_pool)} pairs)")
        heldout = round_robin(rng, heldout_pool, combos(TRAIN), n_eval, f"{task}: heldout")
        # Held-out wording around the exact operand orders that were trained, so wording is the only novelty.
        seen = list(dict.fromkeys(order for _, (order, _) in train)) or train_pool
        picked = round_robin(rng, seen, lambda order: HELDOUT, n_eval, f"{task}: heldout_template")
        heldout_t = [(order, (order, t)) for order, t in picked]
        splits = {
            name: [render(order, t) for _, (order, t) in pairs]
            for name, pairs in (("train", train), ("heldout", heldout), ("heldout_template", heldout_t))
        }
        return check_splits(task, splits, n_train, n_eval)

    def is_correct(self, prediction: str, gold: str) -> bool:
        """The whole answer: formal — both the R part and the A part; plain — the number."""
        parse = parse_formal if self.params.format == "formal" else parse_plain
        said, want = parse(prediction), parse(gold)
        return said is not None and said == want

    def extra_scores(self, prediction: str, gold: str) -> dict[str, bool]:
        """Formal format: ``answer_ok`` — a whole formal answer whose A part is right, whatever its R part. Plain
        format: none (its one number is what ``greedy`` scores)."""
        if self.params.format != "formal":
            return {}
        said, want = parse_formal(prediction), parse_formal(gold)
        return {"answer_ok": said is not None and want is not None and said[1] == want[1]}

    def mode_ok(self, prediction: str) -> bool:
        """Formal: exactly "R d d ; A d d" (single spaces); plain: digits only."""
        pattern = _FORMAL if self.params.format == "formal" else _PLAIN
        return bool(pattern.match(prediction.strip()))
