"""Validate-time checks of ``model.config`` overrides on builtin models: values are built into the transformers
config and the model is instantiated on the ``meta`` device (no memory, no weights), so a bad value is an exit-2
error naming the field instead of a traceback at the first step.

transformers' configs accept almost anything (``hidden_size: -64`` builds a config); sizes are therefore also
checked here: every field whose default is a positive integer must be overridden with a positive integer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from harness.config.schema import ModelSpec

Errors = list[tuple[str, str]]


class _StandInVocabulary:
    """What :func:`harness.models.builtin_config` reads from a tokenizer, before any tokenizer exists."""

    pad_token_id, eos_token_id = 0, 1

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def size_errors(overrides: dict[str, Any], defaults: dict[str, Any]) -> Errors:
    """``model.config.<key>`` errors for overrides of positive-integer fields that are not positive integers."""
    return [(f"model.config.{key}", f"must be a positive integer, got {value!r}")
            for key, value in overrides.items() if _is_positive_int(defaults.get(key)) and not _is_positive_int(value)]


def model_config_errors(spec: "ModelSpec", arch, config_class) -> Errors:
    """Errors of ``spec.config`` (a builtin model whose override keys are known fields): sizes first, then whether
    transformers can build the config and the model from them."""
    # torch and transformers: transformers is already imported by the config class; torch comes with it.
    import torch
    from transformers import AutoModelForCausalLM

    from harness.models import builtin_config

    aliases = getattr(config_class, "attribute_map", {}) or {}
    defaults = {**config_class().to_dict(), **arch.defaults}
    defaults.update({alias: defaults.get(target) for alias, target in aliases.items()})
    errors = size_errors(spec.config, defaults)
    if errors or not spec.config:
        return errors
    try:
        config = builtin_config(spec, _StandInVocabulary(spec.tokenizer.vocab_size))
        with torch.device("meta"):
            AutoModelForCausalLM.from_config(config)
    except (ValueError, TypeError, RuntimeError, AssertionError, ZeroDivisionError, KeyError) as e:
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return [("model.config", f"the {arch.model_type} model cannot be built with these values: {message}")]
    return []
