"""Which weights each stage of a run starts from — its ``init``: the base model's, an earlier stage's, or the previous
stage's with what trained there carried over — and the model a run starts from (a resume point's structure, weights
and random states, or the base model as it is).

:class:`InitStates` keeps the weights later stages start from; :func:`starting_model` builds it at the run's start
and restores a resume point; :func:`stage_model` gives a stage its starting weights and trainable set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from safetensors.torch import load_model

from harness.config import ResolvedStage, TrainableSpec
from harness.training.adapters import drop_adapter, merged_state_dict, prepare_stage_model
from harness.training.checkpoint import Start, load_state_dict


@dataclass
class InitStates:
    """The weights that stages with ``init: base`` or ``init: <earlier stage>`` start from: ``needed`` names them,
    ``states`` holds those known so far (a stage adds its own when it ends, :meth:`keep`)."""

    needed: set[str]
    states: dict[str, dict] = field(default_factory=dict)

    def keep(self, stage: str, model) -> bool:
        """Keep ``model``'s weights when a later stage starts from ``stage``; whether they were needed."""
        if stage not in self.needed:
            return False
        self.states[stage] = merged_state_dict(model)
        return True


def inherited(stages: Sequence[ResolvedStage], index: int) -> TrainableSpec | None:
    """What trained in the stage whose weights stage ``index`` starts from (``init: previous``), else None."""
    return stages[index - 1].train.trainable if index > 0 and stages[index].init == "previous" else None


def starting_model(
    model, start: Start, stages: Sequence[ResolvedStage], run_dir: Path, added: list[int], flagged: list[int]
):
    """``(model, InitStates)`` a run starts with. The states hold the base model's weights (when a stage starts from
    them) and those of the stages a resumed run finished before ``start`` (read back from their checkpoints). The
    model is a resume point's — the structure (adapter or not) of the stage it was in, then its weights and random
    states — or the base model as it is. ``added``: the token ids the harness added; ``flagged``: the base model's
    under-trained special-token ids (both shape a stage's trainable set)."""
    init = InitStates({s.init for s in stages} - {"previous"})
    if "base" in init.needed:
        init.states["base"] = merged_state_dict(model)  # before a resume point's adapter changes the model
    for earlier in stages[: start.stage_index]:
        if earlier.name in init.needed:
            init.states[earlier.name] = load_state_dict(run_dir / "checkpoints" / earlier.name)
    if start.weights is None:
        return model, init
    index = start.weights.stage_index
    model = prepare_stage_model(model, stages[index].train.trainable, added, inherited(stages, index), flagged)
    load_model(model, str(start.weights.file))
    start.weights.restore_rng()  # torch's CPU generator; from a resume point also this rank's others
    return model, init


def stage_model(
    model, stages: Sequence[ResolvedStage], index: int, init: InitStates, added: list[int], flagged: list[int]
):
    """Stage ``index``'s starting model: the weights its ``init`` names (the previous stage's as they are), with the
    stage's trainable set (:func:`harness.training.adapters.prepare_stage_model`)."""
    stage = stages[index]
    if stage.init != "previous":
        model = drop_adapter(model)
        model.load_state_dict(init.states[stage.init])
    return prepare_stage_model(model, stage.train.trainable, added, inherited(stages, index), flagged)
