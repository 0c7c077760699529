"""``eval.benchmarks[]``: one lm-evaluation-harness task run during training (its own module to keep the schema
short; the checks that need the whole file are in :mod:`harness.config.load`, the runner in
:mod:`harness.evaluation.benchmarks`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from harness.config.strict import Strict


class BenchmarkSpec(Strict):
    """One lm-evaluation-harness task run on the in-memory model during training (``pip install -e
    '.[benchmarks]'``); its rows are task ``bench:<task>``, split ``bench``."""

    task: str = Field(
        ...,
        min_length=1,
        description="lm-eval task or group name: a shipped offline one (world_mc, "
        "world_gen), one of lm-eval's own (mmlu, gsm8k, ifeval: need the hub's datasets), or one of "
        "include_path's YAML tasks.",
    )
    include_path: str | None = Field(
        None, description="Directory of the user's own lm-eval task YAMLs (relative to the experiment file)."
    )
    limit: int | None = Field(
        None,
        ge=1,
        description="Documents per task (null: all; world_mc / world_gen: the number generated, default 200).",
    )
    num_fewshot: int | None = Field(None, ge=0, description="Few-shot examples (null: the task's own setting).")
    every: Literal["stage_end"] | int = Field(
        "stage_end",
        description="stage_end: at the run's start and every stage's end; N: at every evaluation whose "
        "step is a multiple of N (a multiple of eval.every), the run's start included.",
    )

    @field_validator("every")
    @classmethod
    def _positive(cls, v):
        if isinstance(v, int) and v < 1:
            raise ValueError("every must be stage_end or a positive step count")
        return v
