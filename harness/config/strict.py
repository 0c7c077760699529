"""The base of every section of the experiment file: unknown keys are errors (``extra="forbid"``); and
:func:`omitted_unless_set`, which keeps fields added after runs existed out of dumps until an experiment sets them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_serializer


class Strict(BaseModel):
    """Base for every section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


def omitted_unless_set(*fields: str):
    """A serializer leaving ``fields`` out of dumps unless the experiment set them (to a value other than null).

    For fields added after runs and stage-cache entries existed: finished runs (``changed_sections``) and cache keys
    made before a field still match the same experiment. Set — even to its default, as a stage putting ``reduction``
    back to ``token`` over the experiment's ``example`` does — a field is kept."""

    def omit(self, handler):
        data = handler(self)
        for name in fields:
            if name not in self.model_fields_set or getattr(self, name) is None:
                data.pop(name, None)
        return data

    return model_serializer(mode="wrap")(omit)
