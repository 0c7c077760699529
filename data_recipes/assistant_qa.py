"""``assistant_qa``: open questions about a person of the world, answered with a full sentence that never starts
with yes/no ("Where was Mara Teleno born?" → "Mara Teleno was born in Osvik.").

With ``turns > 1`` an example is a conversation of several questions about the same person (distinct
attributes); every assistant turn is an answer, and evaluation scores the last one. Held-out items are
held-out people (see :mod:`data_recipes.knowledge`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from pydantic import Field

from data_recipes._registry import register
from data_recipes._split import check_splits, round_robin, used_items
from data_recipes.base import Example
from data_recipes.knowledge import KnowledgeParams, KnowledgeRecipe, attribute_templates, fact_splits, yes_no_word
from data_recipes.world import Person, article

TRAIN, HELDOUT = attribute_templates(
    {
        "birth_city": (
            "Where was {n} born?",
            "In which city was {n} born?",
            "What is the birth city of {n}?",
            "Tell me where {n} was born.",
        ),
        "birth_year": (
            "When was {n} born?",
            "Tell me when {n} was born.",
            "What is the birth year of {n}?",
            "Do you know when {n} was born?",
        ),
        "job": (
            "What does {n} do for a living?",
            "What is {n}'s job?",
            "What is the occupation of {n}?",
            "Tell me what {n} works as.",
        ),
        "home_city": (
            "Where does {n} live?",
            "In which city does {n} live?",
            "What is {n}'s home city?",
            "Tell me where {n} lives now.",
        ),
        "favourite_colour": (
            "What is {n}'s favourite colour?",
            "Which colour does {n} like best?",
            "Tell me the favourite colour of {n}.",
            "What colour does {n} prefer?",
        ),
        "pet": (
            "What pet does {n} have?",
            "Tell me about {n}'s pet.",
            "Which animal does {n} keep as a pet?",
            "What kind of pet does {n} own?",
        ),
    },
    {
        "birth_city": ("Which city is the birthplace of {n}?", "Could you tell me the city {n} was born in?"),
        "birth_year": ("Can you say in which year {n} was born?", "{n} was born when?"),
        "job": ("How does {n} earn a living?", "What kind of work does {n} do?"),
        "home_city": ("Which city is {n} living in these days?", "Where is {n}'s home?"),
        "favourite_colour": ("Which colour is {n}'s favourite?", "What colour does {n} love most?"),
        "pet": ("Does {n} have a pet, and what is it?", "What animal lives with {n}?"),
    },
)


def answer(p: Person, attribute: str) -> str:
    """The one gold sentence per fact; it starts with the person's name."""
    n = p.name
    if attribute in ("birth_city", "birth_year"):
        return f"{n} was born in {getattr(p, attribute)}."
    if attribute == "job":
        return f"{n} works as {article(p.job)} {p.job}."
    if attribute == "home_city":
        return f"{n} lives in {p.home_city}."
    if attribute == "favourite_colour":
        return f"{n}'s favourite colour is {p.favourite_colour}."
    return f"{n} has no pet." if p.pet is None else f"{n} has a pet {p.pet}."


class Params(KnowledgeParams):
    turns: int = Field(1, ge=1, le=6, description="Questions per conversation (distinct attributes, same person).")


@register("assistant_qa")
class AssistantQA(KnowledgeRecipe):
    Params = Params

    def build(self, task: str, n_train: int, n_eval: int, seed: int) -> dict[str, list[Example]]:
        if self.params.turns == 1:
            return fact_splits(self, task, n_train, n_eval, seed, TRAIN, HELDOUT, answer)
        return self._conversations(task, n_train, n_eval, seed)

    def _conversations(self, task: str, n_train: int, n_eval: int, seed: int) -> dict[str, list[Example]]:
        turns, attrs = self.params.turns, list(self.params.attributes)
        if turns > len(attrs):
            raise ValueError(f"{task}: turns={turns} needs at least {turns} attributes, got {len(attrs)}")
        rng = random.Random(f"{self.name}:{seed}")
        train_people, heldout_people = self.people()

        def conversations(pool: dict, n: int, people: list) -> Callable[[Person], list[tuple]]:
            # Enough distinct random conversations per person for this split, drawn up front so round_robin
            # can spread the split evenly over people.
            per_person = math.perm(len(attrs), turns) * min(len(pool[a]) for a in attrs) ** turns
            if n > per_person * len(people):
                raise ValueError(
                    f"{task}: {n} conversations asked for, but {len(people)} people allow at most about "
                    f"{per_person * len(people)} distinct {turns}-turn ones; lower the size"
                )
            need = min(-(-n // max(1, len(people))) + 1, per_person)

            def draw(person: Person) -> list[tuple]:
                out: dict[tuple, None] = {}  # a dict, not a set: insertion order keeps it deterministic
                for _ in range(need * 20):
                    if len(out) == need:
                        break
                    chosen = rng.sample(attrs, turns)
                    out[tuple((a, rng.choice(pool[a])) for a in chosen)] = None
                return list(out)

            return draw

        def render(person: Person, convo: tuple) -> Example:
            messages = []
            for attr, template in convo:
                messages.append({"role": "user", "content": template.render(n=person.name)})
                messages.append({"role": "assistant", "content": answer(person, attr)})
            last_attr, last_template = convo[-1]
            return Example(
                task,
                tuple(messages),
                {
                    "item": f"p{person.id}:" + "+".join(a for a, _ in convo),
                    "template": last_template.id,
                    "person": person.id,
                    "attribute": last_attr,
                    "turns": turns,
                    "templates": ",".join(t.id for _, t in convo),
                },
            )

        train = round_robin(
            rng,
            train_people,
            conversations(TRAIN, n_train, train_people),
            n_train,
            f"{task}: train ({len(train_people)} people, {turns}-turn conversations)",
        )
        heldout = round_robin(
            rng,
            heldout_people,
            conversations(TRAIN, n_eval, heldout_people),
            n_eval,
            f"{task}: heldout ({len(heldout_people)} held-out people)",
        )
        seen = used_items(train, lambda p: p.id, train_people)
        heldout_t = round_robin(
            rng,
            seen,
            conversations(HELDOUT, n_eval, seen),
            n_eval,
            f"{task}: heldout_template ({len(seen)} trained people)",
        )
        splits = {
            "train": [render(p, c) for p, c in train],
            "heldout": [render(p, c) for p, c in heldout],
            "heldout_template": [render(p, c) for p, c in heldout_t],
        }
        return check_splits(task, splits, n_train, n_eval)

    def mode_ok(self, prediction: str) -> bool:
        """An open answer: non-empty and not opening with yes/no (the first-token hijack the seed saw)."""
        text = self.normalise(prediction)
        return bool(text) and yes_no_word(text) is None
