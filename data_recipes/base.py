"""The recipe contract: what every task generator yields and how its outputs are judged.

A recipe is pure Python (no torch): given its validated params, an optional synthetic world, a seed and the
requested sizes, it returns three splits of :class:`Example`:

- ``train``            — items the model is trained on;
- ``heldout``          — items never in ``train`` (unseen words / people / number pairs), training phrasings;
- ``heldout_template`` — phrasings never used in ``train``, applied to items from the training pool, so the only
                         novelty is the wording.

It also owns how a prediction is judged: :meth:`Recipe.normalise`, :meth:`Recipe.is_correct` (exact match after
normalising, unless the task says otherwise), :meth:`Recipe.mode_ok` (does the output have the right *shape*
for this task — e.g. yes/no answers start with yes or no, open answers must not), :meth:`Recipe.extra_scores`
(further per-item scores, e.g. math's ``answer_ok``) and :meth:`Recipe.answer_classes` (the closed answer set of a
classification task, which defines its chance level).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from harness.core.metrics import PROPORTION, declare_metric
from harness.core.plugins import Plugin, PluginParams

if TYPE_CHECKING:  # pragma: no cover
    from data_recipes.world import World

SPLITS: tuple[str, ...] = ("train", "heldout", "heldout_template")


@dataclass(frozen=True)
class Example:
    """One chat example. ``messages`` alternates user/assistant turns and always ends with an assistant turn; it may
    open with one system turn (a data file's, or the task's instruction: ``tasks.<name>.system``).

    Single-turn examples have two messages (three with a system turn). In multi-turn examples every assistant turn
    is supervised in training; evaluation prompts with everything before the last assistant turn and compares
    against that turn.

    ``image`` is ``None`` for text tasks. Image tasks (:attr:`Recipe.has_images`) carry one RGB ``PIL.Image``
    shown with the first user turn (messages stay plain text; the encoder inserts the model's image placeholder),
    and a stable ``meta["image_id"]`` that names it in logs and samples (``meta`` stays JSON-serialisable).
    """

    task: str
    messages: tuple[dict[str, str], ...]
    meta: dict[str, Any] = field(default_factory=dict)
    image: Any = None

    @property
    def prompt(self) -> str:
        """Content of the last user turn."""
        return self.messages[-2]["content"]

    @property
    def answer(self) -> str:
        """Content of the last assistant turn (the gold answer)."""
        return self.messages[-1]["content"]

    @classmethod
    def single(cls, task: str, prompt: str, answer: str, **meta: Any) -> Example:
        return cls(task, ({"role": "user", "content": prompt}, {"role": "assistant", "content": answer}), meta)

    def with_system(self, text: str) -> Example:
        """The example with a system turn ``text`` before its first turn; refused when it already has one."""
        if self.messages[0]["role"] == "system":
            raise ValueError("an example already starts with a system turn")
        return replace(self, messages=({"role": "system", "content": text},) + tuple(self.messages))


def with_system_turn(splits: dict[str, list[Example]], text: str) -> dict[str, list[Example]]:
    """Every split's examples with the system turn ``text`` first (``tasks.<task>.system``); ``ValueError`` when an
    example already has one (a data file's ``system`` column)."""
    return {split: [ex.with_system(text) for ex in examples] for split, examples in splits.items()}


class RecipeParams(PluginParams):
    """Base for each recipe's ``params``; unknown keys are errors (reported at ``tasks.<name>.params.<key>``)."""


_WS = re.compile(r"\s+")


class Recipe(Plugin, ABC):
    """Base class for task generators (a plug-in: :mod:`harness.core.plugins`). Subclasses set ``Params`` and
    implement :meth:`build`; ``@register(name)`` sets ``name``."""

    name: ClassVar[str]
    Params: ClassVar[type[RecipeParams]] = RecipeParams
    needs_world: ClassVar[bool] = False
    #: True for recipes whose examples carry an ``image`` (see :class:`Example`); their prompts may repeat across
    #: splits, since the held-out novelty is in the image (see ``data_recipes/_shapes.py``).
    has_images: ClassVar[bool] = False
    #: What makes a held-out item a training item, which the split check refuses (:mod:`data_recipes.split_check`):
    #: ``"prompt"`` (the same prompt) or ``"prompt_answer"`` (the same prompt and answer: data where one prompt may
    #: have several answers).
    heldout_overlap: ClassVar[str] = "prompt"
    #: Whether the split check builds the recipe a second time to see the same pools for the same seed (False where
    #: the recipe reads a user's file with a seeded shuffle: a second read would cost a second parse).
    rebuild_check: ClassVar[bool] = True
    #: The metrics :meth:`extra_scores` may return, declared proportions when the class is defined
    #: (:data:`harness.core.metrics.METRICS`): each gets ``n``, a Wilson interval and stored outcomes.
    extra_metrics: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for metric in cls.__dict__.get("extra_metrics", ()):
            declare_metric(metric, PROPORTION)

    def __init__(self, params: RecipeParams | None = None, world: World | None = None):
        self.params = params if params is not None else self.Params()
        if self.needs_world and world is None:
            raise ValueError(f"recipe {self.name!r} needs a world")
        self.world = world

    @abstractmethod
    def build(self, task: str, n_train: int, n_eval: int, seed: int) -> dict[str, list[Example]]:
        """Return ``{"train": [...n_train], "heldout": [...n_eval], "heldout_template": [...n_eval]}``.

        Deterministic for ``seed``. Raises ``ValueError`` with a plain message if the sizes cannot be met.
        """

    def normalise(self, text: str) -> str:
        """Default normaliser: lower-case, collapse whitespace, strip surrounding space and final punctuation."""
        return _WS.sub(" ", text).strip().rstrip(".!?").strip().lower()

    def is_correct(self, prediction: str, gold: str) -> bool:
        return self.normalise(prediction) == self.normalise(gold)

    def mode_ok(self, prediction: str) -> bool:
        """Whether ``prediction`` has the shape this task asks for. Default: non-empty."""
        return bool(prediction.strip())

    def extra_scores(self, prediction: str, gold: str) -> dict[str, bool]:
        """Further per-item scores of a greedy output beside :meth:`is_correct`, by metric name (each becomes a
        proportion metric of the ``greedy`` evaluator, e.g. math's ``answer_ok``; list the names in
        :attr:`extra_metrics`). Default: none."""
        return {}

    def answer_classes(self) -> tuple[str, ...]:
        """The closed set of answers, for tasks whose every answer is one of a few classes (yes/no): guessing among
        them uniformly is the task's chance level, and each is a constant answer the baselines try
        (:mod:`harness.evaluation.baselines`). Default: none (an open answer)."""
        return ()
