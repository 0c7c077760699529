"""``yesno``: "Was Mara Teleno born in Osvik?" → "Yes." / "No." over the world's facts.

Each (person, attribute) gives a *yes* item (the true value) and a *no* item (one seeded wrong value: another
city, job, colour or pet; a year 1-15 off). Splits interleave yes and no items, so each is half yes (exactly,
for even sizes, while both kinds last). Held-out items are held-out people.
"""

from __future__ import annotations

import random

from data_recipes._registry import register
from data_recipes._split import check_splits, round_robin, used_items
from data_recipes.base import Example
from data_recipes.knowledge import KnowledgeParams, KnowledgeRecipe, attribute_templates, value, yes_no_word
from data_recipes.world import YEARS, Person, World, article

TRAIN, HELDOUT = attribute_templates(
    {
        "birth_city": ("Was {n} born in {v}?", "Is {v} the birth city of {n}?", "Is {n} originally from {v}?"),
        "birth_year": ("Was {n} born in {v}?", "Is {v} the birth year of {n}?", "Was {n} born in the year {v}?"),
        "job": ("Does {n} work as {a} {v}?", "Is {n} {a} {v}?", "Is {n}'s job {v}?"),
        "home_city": ("Does {n} live in {v}?", "Is {v} the home city of {n}?", "Is {n} living in {v}?"),
        "favourite_colour": (
            "Is {n}'s favourite colour {v}?",
            "Does {n} like {v} best?",
            "Is {v} the favourite colour of {n}?",
        ),
        "pet": ("Does {n} have a pet {v}?", "Does {n} own {a} {v}?", "Is {n}'s pet {a} {v}?"),
    },
    {
        "birth_city": ("Is it true that {n} was born in {v}?", "Was {v} the place where {n} was born?"),
        "birth_year": ("Is it true that {n} was born in {v}?", "Did {n} come into the world in {v}?"),
        "job": ("Is it true that {n} works as {a} {v}?", "Does {n} earn a living as {a} {v}?"),
        "home_city": ("Is it true that {n} lives in {v}?", "Does {n} make a home in {v}?"),
        "favourite_colour": (
            "Is it true that {n}'s favourite colour is {v}?",
            "Would {n} name {v} as a favourite colour?",
        ),
        "pet": ("Is it true that {n} has a pet {v}?", "Does {n} keep {a} {v} as a pet?"),
    },
)
_VOCAB = {"birth_city": "cities", "home_city": "cities", "job": "jobs", "favourite_colour": "colours", "pet": "pets"}


def wrong_value(rng: random.Random, world: World, p: Person, attribute: str) -> str:
    """A plausible false value for the fact."""
    if attribute == "birth_year":
        year = p.birth_year + rng.choice((-1, 1)) * rng.randint(1, 15)
        if not YEARS[0] <= year <= YEARS[1]:
            year = 2 * p.birth_year - year  # mirror back into range
        return str(year)
    choices = [v for v in getattr(world, _VOCAB[attribute]) if v != getattr(p, attribute)]
    return rng.choice(choices)


def _interleave(a: list, b: list) -> list:
    out = [x for pair in zip(a, b) for x in pair]
    return out + a[len(b) :] + b[len(a) :]


@register("yesno")
class YesNo(KnowledgeRecipe):
    Params = KnowledgeParams

    def build(self, task: str, n_train: int, n_eval: int, seed: int) -> dict[str, list[Example]]:
        rng = random.Random(f"{self.name}:{seed}")
        train_people, heldout_people = self.people()
        attrs = list(self.params.attributes)

        def pool(people: list[Person]) -> list[tuple[Person, str, str, str]]:
            yes, no = [], []
            for p in people:
                for a in attrs:
                    truth = value(p, a)
                    if truth is not None:  # a person without a pet has no "yes" pet item
                        yes.append((p, a, truth, "yes"))
                    no.append((p, a, wrong_value(rng, self.world, p, a), "no"))
            rng.shuffle(yes)
            rng.shuffle(no)
            return _interleave(yes, no)

        def render(item: tuple, template) -> Example:
            p, a, v, label = item
            prompt = template.render(n=p.name, v=v, a=article(v))
            return Example.single(
                task,
                prompt,
                label.capitalize() + ".",
                item=f"p{p.id}:{a}={v}",
                template=template.id,
                person=p.id,
                attribute=a,
                label=label,
            )

        def combos(item: tuple) -> tuple:
            return TRAIN[item[1]]

        train_pool, heldout_pool = pool(train_people), pool(heldout_people)
        # shuffle=False keeps the yes/no interleaving; the pools are already shuffled within each kind.
        train = round_robin(
            rng,
            train_pool,
            combos,
            n_train,
            f"{task}: train ({len(train_pool)} items from {len(train_people)} people × 3 templates)",
            shuffle=False,
        )
        heldout = round_robin(
            rng,
            heldout_pool,
            combos,
            n_eval,
            f"{task}: heldout ({len(heldout_pool)} items from {len(heldout_people)} held-out people)",
            shuffle=False,
        )
        seen = used_items(train, lambda it: it[:3], train_pool)
        heldout_t = round_robin(
            rng,
            seen,
            lambda it: HELDOUT[it[1]],
            n_eval,
            f"{task}: heldout_template ({len(seen)} trained items)",
            shuffle=False,
        )
        splits = {
            "train": [render(i, t) for i, t in train],
            "heldout": [render(i, t) for i, t in heldout],
            "heldout_template": [render(i, t) for i, t in heldout_t],
        }
        return check_splits(task, splits, n_train, n_eval)

    def is_correct(self, prediction: str, gold: str) -> bool:
        """The yes/no word decides: "Yes, she was." is correct for "Yes."."""
        said = yes_no_word(self.normalise(prediction))
        return said is not None and said == yes_no_word(self.normalise(gold))

    def mode_ok(self, prediction: str) -> bool:
        return yes_no_word(self.normalise(prediction)) is not None

    def answer_classes(self) -> tuple[str, ...]:
        return ("Yes.", "No.")
