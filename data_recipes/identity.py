"""``identity``: questions about the assistant's identity ("Hi! What is your name?") → one fixed answer built from
``params.name`` ("I am Shengoovlei.").

An item is a (greeting prefix, question, suffix) combination — 24 × 18 × 8 = 3456 of them. ``heldout`` items are
combinations never trained on (each part seen in training, not together); ``heldout_template`` asks question
phrasings never trained on, wrapped in trained prefixes and suffixes. ``meta["template"]`` is the question id.
"""

from __future__ import annotations

import random

from pydantic import Field, field_validator

from data_recipes._registry import register
from data_recipes._split import check_splits, round_robin, templates
from data_recipes.base import Example, Recipe, RecipeParams

PREFIXES = (
    "",
    "Hi! ",
    "Hello. ",
    "Hey, ",
    "Hey there! ",
    "Good morning. ",
    "Good evening! ",
    "Hi there, ",
    "Greetings. ",
    "Hello again! ",
    "Excuse me, ",
    "Quick question: ",
    "Sorry to bother you, but ",
    "Okay, ",
    "So, ",
    "Hmm, ",
    "Hello friend. ",
    "Good afternoon! ",
    "Hiya. ",
    "Yo, ",
    "Before we start, ",
    "One thing first: ",
    "Well, ",
    "Hi again. ",
)
QUESTIONS = templates(
    "t",
    (
        "What is your name?",
        "Who are you?",
        "What should I call you?",
        "What are you called?",
        "Tell me your name.",
        "Introduce yourself.",
        "What's your name?",
        "Who am I talking to?",
        "May I know your name?",
        "Do you have a name?",
        "Who is this?",
        "Please tell me who you are.",
        "What do people call you?",
        "Which assistant are you?",
        "Identify yourself.",
        "Can you tell me your name?",
        "What name do you go by?",
        "Tell me about yourself.",
    ),
)
HELDOUT_QUESTIONS = templates(
    "h",
    (
        "How should I address you?",
        "What's your name, assistant?",
        "Could you say who you are?",
        "Tell me who I'm chatting with.",
        "By what name are you known?",
        "Remind me what your name is.",
    ),
)
SUFFIXES = (
    "",
    " Thanks!",
    " Please answer briefly.",
    " I'm curious.",
    " Just wondering.",
    " Thank you.",
    " :)",
    " Be honest.",
)


class Params(RecipeParams):
    name: str = Field("Shengoovlei", min_length=1, description="The assistant's name.")
    answer: str = Field("I am {name}.", description="The answer; {name} is replaced by the name.")

    @field_validator("answer")
    @classmethod
    def _has_name(cls, v: str) -> str:
        if "{name}" not in v:
            raise ValueError("answer must contain {name}")
        return v


def _join(prefix: str, question: str, suffix: str) -> str:
    # After "Hey, " or "Quick question: " the question continues the sentence, so it starts lower-case.
    if prefix and not prefix.rstrip().endswith((".", "!", "?")):
        question = question[0].lower() + question[1:]
    return f"{prefix}{question}{suffix}"


@register("identity")
class Identity(Recipe):
    Params = Params

    def build(self, task: str, n_train: int, n_eval: int, seed: int) -> dict[str, list[Example]]:
        rng = random.Random(f"{self.name}:{seed}")
        gold = self.params.answer.format(name=self.params.name)
        combos = [(p, q, s) for p in range(len(PREFIXES)) for q in range(len(QUESTIONS)) for s in range(len(SUFFIXES))]
        rng.shuffle(combos)
        if n_train + n_eval > len(combos):
            raise ValueError(
                f"{task}: {n_train} train + {n_eval} heldout examples asked for, but there are only "
                f"{len(combos)} distinct prefix × question × suffix combinations"
            )
        heldout_pool, train_pool = combos[:n_eval], combos[n_eval : n_eval + n_train]

        def render(p: int, question, s: int) -> Example:
            return Example.single(
                task,
                _join(PREFIXES[p], question.text, SUFFIXES[s]),
                gold,
                item=f"{p}|{question.id}|{s}",
                template=question.id,
                prefix=p,
                suffix=s,
            )

        train = [render(p, QUESTIONS[q], s) for p, q, s in train_pool]
        heldout = [render(p, QUESTIONS[q], s) for p, q, s in heldout_pool]
        # Held-out phrasings inside the wrappers (prefix, suffix) of training examples.
        wrappers = list(dict.fromkeys((p, s) for p, _, s in train_pool)) or [(p, s) for p, _, s in combos]
        picked = round_robin(rng, wrappers, lambda w: HELDOUT_QUESTIONS, n_eval, f"{task}: heldout_template")
        heldout_t = [render(p, question, s) for (p, s), question in picked]
        return check_splits(task, {"train": train, "heldout": heldout, "heldout_template": heldout_t}, n_train, n_eval)

    def mode_ok(self, prediction: str) -> bool:
        """The answer names the assistant."""
        return self.params.name.lower() in prediction.lower()
