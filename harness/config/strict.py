"""The base of every section of the experiment file: unknown keys are errors (``extra="forbid"``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Base for every section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")
