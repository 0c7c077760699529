"""The image tasks over synthetic shape scenes (see :mod:`data_recipes._shapes` for scenes, images and splits).

- ``shapes_qa``    — "What colour is the triangle?" → "red"; "What shape is the red object?" → "triangle"
                     (alternating, so half of each kind);
- ``shapes_yesno`` — "Is there a blue square?" → "Yes." / "No." (alternating; a *no* asks about a near miss: the
                     target's colour with a shape not in the picture, or its shape with an absent colour);
- ``count_shapes`` — "How many shapes are in the picture?" → "3" (1–4 objects; ``count`` is the text task that
                     counts letters);
- ``position``     — "Where is the red circle?" → "left" (top / bottom / left / right);
- ``caption``      — "Describe the picture." → "A red triangle at the top and a blue circle on the left." (objects
                     in slot order), the alignment stage's task.
"""

from __future__ import annotations

import random
import re

from data_recipes._registry import register
from data_recipes._shapes import COLOURS, PLACE, POSITIONS, SHAPES, Question, Scene, ShapesRecipe
from data_recipes._split import templates
from data_recipes.knowledge import yes_no_word
from data_recipes.world import article

_INT = re.compile(r"^\d+$")


@register("shapes_qa")
class ShapesQA(ShapesRecipe):
    TRAIN = {
        "colour": templates(
            "tc", ("What colour is the {shape}?", "Which colour does the {shape} have?", "The {shape} is what colour?")
        ),
        "shape": templates(
            "ts",
            ("What shape is the {colour} object?", "Which shape is {colour}?", "The {colour} object is what shape?"),
        ),
    }
    HELDOUT = {
        "colour": templates("hc", ("Tell me the colour of the {shape}.", "Name the colour of the {shape}.")),
        "shape": templates("hs", ("Tell me the shape of the {colour} object.", "Name the {colour} shape.")),
    }

    def ask(self, scene: Scene, index: int, rng: random.Random) -> Question:
        colour, shape, _ = scene.target_object
        if index % 2 == 0:
            return Question("colour", {"shape": shape}, colour)
        return Question("shape", {"colour": colour}, shape)

    def mode_ok(self, prediction: str) -> bool:
        """A single colour or shape word."""
        return self.normalise(prediction) in set(COLOURS) | set(SHAPES)


@register("shapes_yesno")
class ShapesYesNo(ShapesRecipe):
    TRAIN = {
        "q": templates(
            "t",
            (
                "Is there a {colour} {shape}?",
                "Can you see a {colour} {shape}?",
                "Does the picture show a {colour} {shape}?",
            ),
        )
    }
    HELDOUT = {
        "q": templates("h", ("Is a {colour} {shape} visible in the image?", "Would you find a {colour} {shape} here?"))
    }

    def ask(self, scene: Scene, index: int, rng: random.Random) -> Question:
        colour, shape, _ = scene.target_object
        if index % 2 == 0:
            return Question("q", {"colour": colour, "shape": shape}, "Yes.")
        present = set(scene.objects)
        absent_shapes = [s for s in SHAPES if (colour, s) not in {(c, t) for c, t, _ in present}]
        absent_colours = [c for c in COLOURS if (c, shape) not in {(o, t) for o, t, _ in present}]
        # A near miss: one attribute right, the other wrong, so neither word alone decides the answer.
        if rng.random() < 0.5:
            colour, shape = colour, rng.choice([s for s in absent_shapes if s != shape])
        else:
            colour, shape = rng.choice([c for c in absent_colours if c != colour]), shape
        return Question("q", {"colour": colour, "shape": shape}, "No.")

    def is_correct(self, prediction: str, gold: str) -> bool:
        said = yes_no_word(self.normalise(prediction))
        return said is not None and said == yes_no_word(self.normalise(gold))

    def mode_ok(self, prediction: str) -> bool:
        return yes_no_word(self.normalise(prediction)) is not None


@register("count_shapes")
class CountShapes(ShapesRecipe):
    TRAIN = {
        "q": templates("t", ("How many shapes are in the picture?", "How many shapes are there?", "Count the shapes."))
    }
    HELDOUT = {
        "q": templates("h", ("What is the number of objects in the image?", "Tell me how many objects you see."))
    }

    def object_counts(self) -> tuple[int, int]:
        return 1, len(POSITIONS)  # every count from 1 to 4, whatever min/max_objects say

    def ask(self, scene: Scene, index: int, rng: random.Random) -> Question:
        return Question("q", {}, str(len(scene.objects)))

    def is_correct(self, prediction: str, gold: str) -> bool:
        said = self.normalise(prediction)
        return bool(_INT.match(said)) and int(said) == int(self.normalise(gold))

    def mode_ok(self, prediction: str) -> bool:
        return bool(_INT.match(self.normalise(prediction)))


@register("position")
class Position(ShapesRecipe):
    TRAIN = {
        "q": templates(
            "t",
            (
                "Where is the {colour} {shape}?",
                "Where is the {colour} {shape} placed?",
                "On which side is the {colour} {shape}?",
            ),
        )
    }
    HELDOUT = {
        "q": templates(
            "h", ("Tell me where the {colour} {shape} is.", "In what part of the image is the {colour} {shape}?")
        )
    }

    def ask(self, scene: Scene, index: int, rng: random.Random) -> Question:
        colour, shape, position = scene.target_object
        return Question("q", {"colour": colour, "shape": shape}, position)

    def mode_ok(self, prediction: str) -> bool:
        return self.normalise(prediction) in POSITIONS


def caption_text(scene: Scene) -> str:
    """ "A red triangle at the top and a blue circle on the left." (objects in slot order)."""
    parts = [f"{article(colour)} {colour} {shape} {PLACE[position]}" for colour, shape, position in scene.objects]
    text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return text[0].upper() + text[1:] + "."


@register("caption")
class Caption(ShapesRecipe):
    TRAIN = {"q": templates("t", ("Describe the picture.", "What is in the image?", "Describe what you see."))}
    HELDOUT = {"q": templates("h", ("Give a short description of this image.", "What does the picture show?"))}

    def ask(self, scene: Scene, index: int, rng: random.Random) -> Question:
        return Question("q", {}, caption_text(scene))

    def mode_ok(self, prediction: str) -> bool:
        """Names at least one colour and one shape."""
        words = set(self.normalise(prediction).replace(",", " ").split())
        return bool(words & set(COLOURS)) and bool(words & set(SHAPES))
