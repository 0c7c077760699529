"""A synthetic, seeded world of people and the pretraining corpus that describes them.

The knowledge recipes (``yesno``, ``assistant_qa``, ``short_qa``) ask about these people; :func:`corpus` writes
every fact of every person (held-out people included) into plain prose, so a base model pretrained on it has
seen the facts, and SFT on some people tests whether knowledge about the others is unlocked.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from data_recipes.words import pseudo_word, unique

CITIES: tuple[str, ...] = (
    "Osvik",
    "Bramholt",
    "Teradun",
    "Lisvaro",
    "Kelmar",
    "Dunmere",
    "Varenza",
    "Corvel",
    "Ashwick",
    "Mirova",
    "Pellham",
    "Quorin",
    "Sandrel",
    "Tovik",
    "Ulmsted",
    "Vesk",
    "Wendal",
    "Yarrow",
    "Zennor",
    "Belcastro",
    "Darnoth",
    "Elmsby",
    "Fennick",
    "Galvar",
    "Hollin",
    "Istra",
    "Jorvale",
    "Karsk",
    "Lunden",
    "Marrow",
    "Norrin",
    "Orland",
    "Pavesi",
    "Rendham",
    "Solvay",
    "Tallis",
    "Umbra",
    "Valtor",
    "Westrey",
    "Brenna",
)
JOBS: tuple[str, ...] = (
    "baker",
    "teacher",
    "nurse",
    "carpenter",
    "fisher",
    "farmer",
    "painter",
    "doctor",
    "engineer",
    "pilot",
    "tailor",
    "chemist",
    "librarian",
    "musician",
    "plumber",
    "gardener",
    "lawyer",
    "architect",
    "mechanic",
    "potter",
    "butcher",
    "jeweller",
    "sailor",
    "miner",
    "translator",
    "photographer",
    "dentist",
    "electrician",
    "journalist",
    "blacksmith",
)
COLOURS: tuple[str, ...] = (
    "red",
    "blue",
    "green",
    "yellow",
    "orange",
    "purple",
    "pink",
    "brown",
    "black",
    "white",
    "grey",
    "teal",
    "violet",
    "silver",
    "gold",
    "amber",
)
PETS: tuple[str, ...] = ("cat", "dog", "parrot", "rabbit", "hamster", "goldfish", "tortoise", "ferret")
PET_SHARE = 0.6  # share of people with a pet; the rest have none (a fact too: "X has no pet.")
YEARS = (1900, 2010)


@dataclass(frozen=True)
class Person:
    """One person of the world. ``pet`` is a species (``"cat"``) or ``None``."""

    id: int
    name: str
    birth_city: str
    birth_year: int
    job: str
    home_city: str
    favourite_colour: str
    pet: str | None


@dataclass(frozen=True)
class World:
    """The people and the vocabularies their facts are drawn from (used for distractors and filler text)."""

    people: tuple[Person, ...]
    cities: tuple[str, ...]
    jobs: tuple[str, ...]
    colours: tuple[str, ...]
    pets: tuple[str, ...]
    seed: int

    def person(self, id: int) -> Person:
        return self.people[id]


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _name(rng: random.Random) -> str:
    first = pseudo_word(rng, 2, 2).capitalize()
    last = pseudo_word(rng, 2, 3).capitalize()
    return f"{first} {last}"


def build_world(people: int, seed: int) -> World:
    """``people`` persons with unique made-up names and random facts; deterministic for ``(people, seed)``."""
    if people < 1:
        raise ValueError(f"a world needs at least one person, got people={people}")
    rng = random.Random(f"world:{seed}")
    # Two-syllable first names can never be "Yes"/"No", which would make an open answer look like a yes/no one.
    names = unique(rng, _name, people, what="names")
    out = []
    for i, name in enumerate(names):
        out.append(
            Person(
                id=i,
                name=name,
                birth_city=rng.choice(CITIES),
                birth_year=rng.randint(*YEARS),
                job=rng.choice(JOBS),
                home_city=rng.choice(CITIES),
                favourite_colour=rng.choice(COLOURS),
                pet=rng.choice(PETS) if rng.random() < PET_SHARE else None,
            )
        )
    return World(tuple(out), CITIES, JOBS, COLOURS, PETS, seed)


# --- corpus -----------------------------------------------------------------------------------------------------

_FACTS = {
    "birth_city": (
        "{n} was born in {v}.",
        "{v} is the birth city of {n}.",
        "The birthplace of {n} is {v}.",
        "{n} was born in the city of {v}.",
    ),
    "birth_year": (
        "{n} was born in {v}.",
        "{n} was born in the year {v}.",
        "The birth year of {n} is {v}.",
        "{v} is the year {n} was born.",
    ),
    "birth": ("{n} was born in {c} in {y}.", "In {y}, {n} was born in {c}."),
    "job": (
        "{n} works as {a} {v}.",
        "{n} is {a} {v} by trade.",
        "By profession, {n} is {a} {v}.",
        "{n} earns a living as {a} {v}.",
    ),
    "home_city": (
        "{n} lives in {v}.",
        "These days {n} lives in {v}.",
        "The home city of {n} is {v}.",
        "{n} has a home in {v}.",
    ),
    "favourite_colour": (
        "{n}'s favourite colour is {v}.",
        "The favourite colour of {n} is {v}.",
        "{n} likes {v} more than any other colour.",
        "Of all colours, {n} likes {v} best.",
    ),
    "pet": ("{n} has a pet {v}.", "{n} owns {a} {v}.", "{n} keeps {a} {v} as a pet.", "The pet of {n} is {a} {v}."),
    "no_pet": ("{n} has no pet.", "{n} does not keep any pets.", "{n} lives without a pet."),
}

_FILLER = (
    "{c} is {a_adj} {adj} city near the {feature}.",
    "Many people in {c} work as {a} {job}.",
    "The streets of {c} are {adj2}.",
    "It takes a day to travel from {c} to {c2}.",
    "{c} is known for its {thing}.",
    "{A} {job} usually starts work early.",
    "Being {a} {job} takes years of practice.",
    "In {c}, {a} {job} is always in demand.",
    "The road from {c} to {c2} passes the {feature}.",
    "Every spring, {c} holds a fair for its {thing}.",
)
_ADJ = ("small", "large", "quiet", "busy", "old", "young", "windy", "sunny", "rainy", "famous")
_ADJ2 = ("narrow", "wide", "crowded", "clean", "steep", "empty", "long")
_FEATURE = ("river", "coast", "mountains", "forest", "lake", "border", "hills", "marshes")
_THING = ("markets", "bridges", "bread", "music", "gardens", "boats", "towers", "festivals", "cheese", "wool")


def _person_doc(rng: random.Random, p: Person, permute: bool = True) -> str:
    n = p.name
    parts: list[str] = []
    if rng.random() < 0.3:
        parts.append(rng.choice(_FACTS["birth"]).format(n=n, c=p.birth_city, y=p.birth_year))
    else:
        parts.append(rng.choice(_FACTS["birth_city"]).format(n=n, v=p.birth_city))
        parts.append(rng.choice(_FACTS["birth_year"]).format(n=n, v=p.birth_year))
    parts.append(rng.choice(_FACTS["job"]).format(n=n, v=p.job, a=article(p.job)))
    parts.append(rng.choice(_FACTS["home_city"]).format(n=n, v=p.home_city))
    parts.append(rng.choice(_FACTS["favourite_colour"]).format(n=n, v=p.favourite_colour))
    if p.pet is None:
        parts.append(rng.choice(_FACTS["no_pet"]).format(n=n))
    else:
        parts.append(rng.choice(_FACTS["pet"]).format(n=n, v=p.pet, a=article(p.pet)))
    # The name always opens the document; the other facts come in varied order (unless ``permute`` is off: then
    # always birth, job, home city, colour, pet).
    head, rest = parts[0], parts[1:]
    if permute:
        rng.shuffle(rest)
    return " ".join([head, *rest])


def _filler_doc(rng: random.Random, world: World) -> str:
    sentences = []
    for _ in range(rng.randint(3, 5)):
        job = rng.choice(world.jobs)
        c, c2 = rng.sample(world.cities, 2)
        adj = rng.choice(_ADJ)
        sentences.append(
            rng.choice(_FILLER).format(
                c=c,
                c2=c2,
                job=job,
                a=article(job),
                A=article(job).capitalize(),
                adj=adj,
                a_adj=article(adj),
                adj2=rng.choice(_ADJ2),
                feature=rng.choice(_FEATURE),
                thing=rng.choice(_THING),
            )
        )
    return " ".join(sentences)


def corpus(
    world: World, seed: int, docs_per_person: int = 4, filler_docs: int | None = None, permute: bool = True
) -> list[str]:
    """Pretraining documents, deterministic for ``(world, seed)``.

    Every person gets ``docs_per_person`` short documents, each stating *all* their facts in freshly drawn
    phrasings (so each fact is seen several times, in several wordings); ``filler_docs`` (default: one per
    city and job) add generic prose about the cities and jobs. Documents are shuffled together.
    About 1 KB per person with the defaults. ``permute=False`` keeps each document's facts in one fixed order;
    with ``docs_per_person=1`` each person then has one fixed biography (Allen-Zhu & Li 3.1's unaugmented
    "bioS single"; the defaults are their augmented "multi + permute").
    """
    rng = random.Random(f"corpus:{world.seed}:{seed}")
    docs = [_person_doc(rng, p, permute) for p in world.people for _ in range(docs_per_person)]
    n_filler = len(world.cities) + len(world.jobs) if filler_docs is None else filler_docs
    docs += [_filler_doc(rng, world) for _ in range(n_filler)]
    rng.shuffle(docs)
    return docs


def heldout_corpus(
    world: World, pretraining: list[str], n: int, docs_per_person: int = 4, permute: bool = True
) -> list[str]:
    """``n`` documents of :func:`corpus`'s kind that are not in ``pretraining`` (the run's pretraining corpus),
    deterministic for the world: the generator under a seed string no pretraining corpus uses (``corpus`` seeds
    its own ``random.Random`` from ``f"corpus:{world.seed}:{seed}"`` and pretraining passes an int, so this draws
    other documents and leaves every RNG of the run untouched). The forgetting probe's default reference text."""
    seen = set(pretraining)
    fresh = corpus(world, "heldout-reference", docs_per_person=docs_per_person, permute=permute)  # type: ignore[arg-type]
    return [doc for doc in dict.fromkeys(fresh) if doc not in seen][:n]
