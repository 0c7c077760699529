"""The experiment file's run-side sections: where results go (``tracking``), how bad data is handled (``data``) and
the ``debug`` switches that show the safety nets working."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from harness.config.strict import Strict


class WandbSpec(Strict):
    mode: Literal["offline", "online", "disabled"] = "offline"
    project: str = "harness"
    entity: str | None = None
    group: str | None = None
    tags: list[str] = Field(default_factory=list)


class TrackingSpec(Strict):
    wandb: WandbSpec = Field(default_factory=WandbSpec)
    console: bool = Field(True, description="Progress bars and tables on the console.")


class DataSpec(Strict):
    """How bad training data is handled."""

    too_long: Literal["drop", "error"] = Field(
        "drop", description="Examples longer than train.max_length: drop them (counted per task) or stop."
    )
    special_tokens_in_text: Literal["error", "escape"] = Field(
        "error",
        description="Rows whose text contains a special-token string (<|im_end|>): stop naming the row, or "
        "escape it (a zero-width space after its first character) so it stays plain text.",
    )


class InjectSpec(Strict):
    step: int = Field(..., ge=1, description="Global step at which to inject.")
    repeat: int = Field(1, ge=1, description="Inject at this many consecutive steps.")
    where: Literal["forward", "grad"] = "forward"
    module: str = Field(..., description="Regex over module names (forward) or parameter names (grad).")
    rank: int | None = Field(None, ge=0, description="Data-parallel runs: inject on this rank only (default all).")


class KillSpec(Strict):
    rank: int = Field(0, ge=0, description="The rank that dies (0 in a single process).")
    step: int = Field(..., ge=1, description="Global step before whose forward it dies.")


class DebugSpec(Strict):
    """Switches for seeing the safety nets work."""

    inject_nonfinite: InjectSpec | None = Field(None, description="Make an output / gradient NaN at a step.")
    kill_rank: KillSpec | None = Field(
        None,
        description="SIGKILL one rank (or the single process) at a step, as "
        "a crash or the OOM killer would. Left out of --resume's same-experiment check.",
    )
    drop_images: bool = Field(
        False,
        description="Feed every image as all-zero pixels (training and "
        "evaluation): the seed's blind-model bug, on purpose.",
    )


def computing_debug(debug: dict[str, Any]) -> dict[str, Any]:
    """A resolved ``debug`` section without the switches that only stop a run (``kill_rank``): what the run
    computes — the part the stage-cache key and ``--resume``'s same-experiment check compare."""
    return {k: v for k, v in debug.items() if k != "kill_rank"}
