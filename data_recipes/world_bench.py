"""Rows of the offline benchmarks the harness ships as lm-evaluation-harness tasks (``world_mc``, ``world_gen``),
generated from the synthetic world; pure and seeded (no torch, no lm-eval).

Both ask about facts the builtin base model read in pretraining (:func:`data_recipes.world.corpus` states every
fact of every person), in the corpus's own prose rather than in any SFT task's chat format — so their curve during
SFT reads as "general ability kept" (knowledge from pretraining, asked as pretraining asked it), not as a trained
task:

- ``world_mc``: four-option log-likelihood multiple choice. ``context`` is a fact's sentence up to its value
  ("Mara Teleno was born in the city of"), ``choices`` the true value and three other values of the same kind, in
  a seeded order, ``answer`` the true one's index (lm-eval scores ``acc``: the choice with the highest
  log-likelihood after the context);
- ``world_gen``: a short generation. ``context`` asks for a birth year in prose ("The birth year of Mara Teleno
  is"), ``answer`` the year ("1953"); lm-eval greedy-decodes until "." or a newline (``exact_match``, spaces
  ignored — the builtin tokenizer writes digits one per token).

People are drawn without replacement in a seeded order over the whole world (held-out people of the knowledge
tasks included: pretraining saw everyone).
"""

from __future__ import annotations

import random
from typing import Any

from data_recipes.world import World, article

#: (attribute, sentence up to the value, the world's vocabulary of that attribute), from the corpus's phrasings
_MC_FACTS = (
    ("birth_city", "{n} was born in the city of", "cities"),
    ("job", "By profession, {n} is", "jobs"),
    ("home_city", "The home city of {n} is", "cities"),
    ("favourite_colour", "The favourite colour of {n} is", "colours"),
)
_GEN_FACT = "The birth year of {n} is"
CHOICES = 4


def _value(attribute: str, value: str) -> str:
    return f"{article(value)} {value}" if attribute == "job" else value


def world_mc_rows(world: World, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` four-option questions (at most one per person × attribute), each ``{id, context, choices, answer,
    person, attribute}``."""
    rng = random.Random(f"world_mc:{world.seed}:{seed}")
    pairs = [(p, fact) for p in world.people for fact in _MC_FACTS]
    rng.shuffle(pairs)
    rows = []
    for person, (attribute, sentence, vocabulary) in pairs[:n]:
        truth = getattr(person, attribute)
        wrong = rng.sample([v for v in getattr(world, vocabulary) if v != truth], CHOICES - 1)
        options = [truth, *wrong]
        rng.shuffle(options)
        rows.append(
            {
                "id": len(rows),
                "context": sentence.format(n=person.name),
                "choices": [_value(attribute, v) for v in options],
                "answer": options.index(truth),
                "person": person.id,
                "attribute": attribute,
            }
        )
    return rows


def world_gen_rows(world: World, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` birth-year questions (one per person), each ``{id, context, answer, person}``."""
    rng = random.Random(f"world_gen:{world.seed}:{seed}")
    people = list(world.people)
    rng.shuffle(people)
    return [
        {"id": i, "context": _GEN_FACT.format(n=p.name), "answer": str(p.birth_year), "person": p.id}
        for i, p in enumerate(people[:n])
    ]


#: Shipped benchmark name → its row generator (``eval.benchmarks[].task``)
WORLD_BENCHMARKS = {"world_mc": world_mc_rows, "world_gen": world_gen_rows}
