"""Synthetic shape scenes for the image tasks: sampling, drawing (PIL) and the shared split logic.

A *scene* is 1–4 objects, each a (colour, shape, position) *triple*, on a white square. Positions are the four
slots ``top``, ``bottom``, ``left``, ``right`` (a diamond layout, so every object has a one-word place); within a
scene colours, shapes and positions are all distinct, so "the triangle" or "the red object" is never ambiguous.
Each object is drawn at its slot with a small seeded jitter, so two images of the same scene differ slightly.

How an image travels: every :class:`~data_recipes.base.Example` of an image task has ``image`` (an RGB
``PIL.Image`` of ``params.image_size`` pixels, drawn deterministically from the scene and a jitter seed) and
``meta["image_id"]`` (``"<scene key>~<jitter seed>"``, e.g. ``"red-triangle@top|blue-circle@left~4821"``),
which names the image in samples and logs. The prompt text never mentions the image: the encoder inserts the
model's image placeholder before the first user turn's text.

Splits (the contract of :mod:`data_recipes.base`, for images):

- held-out *combinations*: a seeded set of triples (``heldout_fraction`` of all 96; or, with
  ``holdout: pair``, every triple of a few held-out (colour, shape) pairs) is never drawn in ``train``. A
  ``heldout`` scene's *target* (the object the question is about) is a held-out triple, its other objects are not
  — so the only novelty is the combination. The set depends on ``holdout_seed`` only, not on the task seed, so
  every image task in an experiment holds out the same combinations (one task's held-out combination is never
  another task's training image);
- ``heldout_template``: the first ``n_eval`` training scenes (the same images) asked with phrasings never used in
  training. Prompts may repeat across splits (e.g. "How many shapes are there?"): the item is the image.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from PIL import Image, ImageDraw
from pydantic import Field, model_validator

from data_recipes._split import Template
from data_recipes.base import Example, Recipe, RecipeParams

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 200, 30),
    "purple": (140, 60, 170),
    "orange": (245, 130, 20),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond")
POSITIONS: tuple[str, ...] = ("top", "bottom", "left", "right")
BACKGROUND = (255, 255, 255)
# Slot centres as fractions of the side; objects have radius 0.16 and jitter ±0.04, so neighbours never touch.
_CENTRES = {"top": (0.5, 0.23), "bottom": (0.5, 0.77), "left": (0.23, 0.5), "right": (0.77, 0.5)}
_RADIUS, _JITTER = 0.16, 0.04
# layout: grid — slots at the centres of the edge cells of a 3×3 grid; radius + jitter (0.15) stays inside the
# cell's half-width (1/6), so with patch_size = image_size / 3 every object lies within one image patch.
_GRID_CENTRES = {"top": (0.5, 1 / 6), "bottom": (0.5, 5 / 6), "left": (1 / 6, 0.5), "right": (5 / 6, 0.5)}
_GRID_RADIUS, _GRID_JITTER = 0.13, 0.02
LAYOUTS = {"diamond": (_CENTRES, _RADIUS, _JITTER), "grid": (_GRID_CENTRES, _GRID_RADIUS, _GRID_JITTER)}
_MAX_TRIES = 1000  # rejection sampling of one scene; the pools are large, so this is never reached in practice

Triple = tuple[str, str, str]  # (colour, shape, position)


class ShapesParams(RecipeParams):
    """Params shared by the image tasks."""

    image_size: int = Field(32, ge=16, le=512, description="Side of the square image, pixels.")
    min_objects: int = Field(1, ge=1, le=4)
    max_objects: int = Field(3, ge=1, le=4)
    holdout: Literal["triple", "pair"] = Field(
        "triple", description="Hold out (colour, shape, position) triples, or whole (colour, shape) pairs."
    )
    heldout_fraction: float = Field(0.2, gt=0, lt=0.5, description="Share of triples (or pairs) held out.")
    holdout_seed: int = Field(0, description="Seed of the held-out set; keep it equal across image tasks.")
    layout: Literal["diamond", "grid"] = Field(
        "diamond",
        description="Where the slots are: diamond (centres 0.23 / 0.77 of the side from the edges, "
        "objects of radius 0.16) or grid (the edge cells of a 3×3 grid, radius 0.13: with the vision tower's "
        "patch_size = image_size / 3 each object is one image token).",
    )

    @model_validator(mode="after")
    def _range(self) -> ShapesParams:
        if self.min_objects > self.max_objects:
            raise ValueError("min_objects must not exceed max_objects")
        return self


def heldout_triples(params: ShapesParams) -> frozenset[Triple]:
    """The held-out combinations; every colour, shape and position still occurs in training triples."""
    rng = random.Random(f"shapes-holdout:{params.holdout_seed}")
    if params.holdout == "pair":
        pairs = list(itertools.product(COLOURS, SHAPES))
        rng.shuffle(pairs)
        held_pairs = pairs[: max(1, round(params.heldout_fraction * len(pairs)))]
        return frozenset((c, s, p) for c, s in held_pairs for p in POSITIONS)
    triples = list(itertools.product(COLOURS, SHAPES, POSITIONS))
    rng.shuffle(triples)
    return frozenset(triples[: max(1, round(params.heldout_fraction * len(triples)))])


@dataclass(frozen=True)
class Scene:
    """Objects in slot order (``POSITIONS``); ``target`` indexes the object a question is about."""

    objects: tuple[Triple, ...]
    target: int
    jitter_seed: int

    @property
    def key(self) -> str:
        return "|".join(f"{c}-{s}@{p}" for c, s, p in self.objects)

    @property
    def image_id(self) -> str:
        return f"{self.key}~{self.jitter_seed}"

    @property
    def target_object(self) -> Triple:
        return self.objects[self.target]


def sample_scene(rng: random.Random, n_objects: int, held: frozenset[Triple], novel: bool) -> Scene:
    """A scene of ``n_objects`` with distinct colours, shapes and positions. ``novel``: the target is a held-out
    triple and the rest are not; otherwise no object is held out."""
    for _ in range(_MAX_TRIES):
        positions = rng.sample(POSITIONS, n_objects)
        colours = rng.sample(list(COLOURS), n_objects)
        shapes = rng.sample(SHAPES, n_objects)
        objects = list(zip(colours, shapes, positions))
        flags = [o in held for o in objects]
        if (novel and flags[0] and not any(flags[1:])) or (not novel and not any(flags)):
            target_triple = objects[0]
            ordered = tuple(sorted(objects, key=lambda o: POSITIONS.index(o[2])))
            return Scene(ordered, ordered.index(target_triple), rng.randrange(10_000))
    raise ValueError(
        f"could not draw a {'held-out' if novel else 'training'} scene of {n_objects} objects; lower heldout_fraction"
    )


def draw_scene(scene: Scene, size: int, layout: str = "diamond") -> Image.Image:
    """The scene as an RGB image; deterministic for (scene, size, layout)."""
    image = Image.new("RGB", (size, size), BACKGROUND)
    pen = ImageDraw.Draw(image)
    jitter = random.Random(scene.jitter_seed)
    centres, radius, spread = LAYOUTS[layout]
    r = radius * size
    for colour, shape, position in scene.objects:
        fx, fy = centres[position]
        x = (fx + jitter.uniform(-spread, spread)) * size
        y = (fy + jitter.uniform(-spread, spread)) * size
        fill = COLOURS[colour]
        if shape == "circle":
            pen.ellipse((x - r, y - r, x + r, y + r), fill=fill)
        elif shape == "square":
            s = r * 0.85  # a square of half-side r looks much bigger than a circle of radius r
            pen.rectangle((x - s, y - s, x + s, y + s), fill=fill)
        elif shape == "triangle":
            pen.polygon([(x, y - r), (x + r, y + r * 0.8), (x - r, y + r * 0.8)], fill=fill)
        else:  # diamond
            pen.polygon([(x, y - r), (x + r, y), (x, y + r), (x - r, y)], fill=fill)
    return image


PLACE = {"top": "at the top", "bottom": "at the bottom", "left": "on the left", "right": "on the right"}


@dataclass(frozen=True)
class Question:
    """What a task asks about a scene: the template kind, the template fields and the gold answer."""

    kind: str
    fields: dict[str, str]
    answer: str


class ShapesRecipe(Recipe):
    """Base of the image tasks: scenes per split, a question per scene (:meth:`ask`), templates per kind.

    Subclasses set ``TRAIN`` / ``HELDOUT`` (``{kind: templates}``, disjoint texts) and implement :meth:`ask`.
    """

    Params = ShapesParams
    has_images: ClassVar[bool] = True
    TRAIN: ClassVar[dict[str, tuple[Template, ...]]]
    HELDOUT: ClassVar[dict[str, tuple[Template, ...]]]

    def ask(self, scene: Scene, index: int, rng: random.Random) -> Question:
        """The question about ``scene`` (``index`` is its position in the split, for balancing kinds)."""
        raise NotImplementedError

    def object_counts(self) -> tuple[int, int]:
        return self.params.min_objects, self.params.max_objects

    def build(self, task: str, n_train: int, n_eval: int, seed: int) -> dict[str, list[Example]]:
        self._check_sizes(task, n_train, n_eval)
        rng = random.Random(f"{self.name}:{seed}")
        held = heldout_triples(self.params)
        low, high = self.object_counts()

        def scenes(n: int, novel: bool) -> list[tuple[Scene, Question]]:
            out = []
            for i in range(n):
                scene = sample_scene(rng, rng.randint(low, high), held, novel)
                out.append((scene, self.ask(scene, i, rng)))
            return out

        train, heldout = scenes(n_train, False), scenes(n_eval, True)
        if n_eval and not train:
            raise ValueError(f"{task}: heldout_template needs training scenes; train is 0")
        reused = [train[i % len(train)] for i in range(n_eval)] if train else []
        return {
            "train": self._render(task, train, self.TRAIN, "train"),
            "heldout": self._render(task, heldout, self.TRAIN, "heldout"),
            "heldout_template": self._render(task, reused, self.HELDOUT, "heldout_template"),
        }

    def _check_sizes(self, task: str, n_train: int, n_eval: int) -> None:
        # Scenes are drawn with replacement from a space of tens of thousands of jittered images; a request far
        # beyond it would only repeat images, so it is refused like the text recipes refuse impossible sizes.
        limit = 200_000
        if n_train > limit or n_eval > limit:
            raise ValueError(f"{task}: at most {limit} examples per split; asked for {max(n_train, n_eval)}")

    def _render(
        self, task: str, items: list[tuple[Scene, Question]], templates: dict[str, tuple[Template, ...]], split: str
    ) -> list[Example]:
        used: dict[str, int] = {}
        out = []
        for scene, question in items:
            options = templates[question.kind]
            template = options[used.get(question.kind, 0) % len(options)]  # an even spread of phrasings
            used[question.kind] = used.get(question.kind, 0) + 1
            prompt = template.render(**question.fields)
            colour, shape, position = scene.target_object
            meta: dict[str, Any] = {
                "item": scene.image_id,
                "template": template.id,
                "image_id": scene.image_id,
                "kind": question.kind,
                "target": f"{colour}-{shape}@{position}",
                "n_objects": len(scene.objects),
            }
            image = draw_scene(scene, self.params.image_size, self.params.layout)
            out.append(
                Example(
                    task,
                    ({"role": "user", "content": prompt}, {"role": "assistant", "content": question.answer}),
                    meta,
                    image,
                )
            )
        return out
