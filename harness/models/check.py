"""Validate-time checks of the ``model`` section that need the model layer: an unknown builtin, unknown config
fields, image-text fields, and ``model.config`` overrides on builtin models — values are built into the transformers
config and the model is instantiated on the ``meta`` device (no memory, no weights), so a bad value is an exit-2
error naming the field instead of a traceback at the first step.

transformers' configs accept almost anything (``hidden_size: -64`` builds a config); sizes are therefore also
checked here: every field whose default is a positive integer must be overridden with a positive integer.

:func:`check_model_spec` is registered in :data:`harness.core.registry.MODEL_CHECKS` (as the plug-in
:class:`ModelSectionCheck`), through which ``harness.config`` runs it without importing this layer. A model check
of one's own subclasses :class:`ModelCheck` and registers with ``@MODEL_CHECKS.plugin("name")``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.core.plugins import Plugin
from harness.core.registry import BUILTIN_MODELS, MODEL_CHECKS, suggest
from harness.models.builtin import _config_class, builtin_config
from harness.models.image_text import DEFAULT_TEXT, VISION_BUILTIN, VISION_DEFAULTS, text_spec

if TYPE_CHECKING:  # pragma: no cover
    from harness.config.schema import ModelSpec

Errors = list[tuple[str, str]]


class _StandInVocabulary:
    """What :func:`harness.models.builtin.builtin_config` reads from a tokenizer, before any tokenizer exists."""

    pad_token_id, eos_token_id = 0, 1

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def size_errors(overrides: dict[str, Any], defaults: dict[str, Any]) -> Errors:
    """``model.config.<key>`` errors for overrides of positive-integer fields that are not positive integers."""
    return [
        (f"model.config.{key}", f"must be a positive integer, got {value!r}")
        for key, value in overrides.items()
        if _is_positive_int(defaults.get(key)) and not _is_positive_int(value)
    ]


def model_config_errors(spec: ModelSpec, arch, config_class) -> Errors:
    """Errors of ``spec.config`` (a builtin model whose override keys are known fields): sizes first, then whether
    transformers can build the config and the model from them."""
    # torch and transformers: transformers is already imported by the config class; torch comes with it.
    import torch
    from transformers import AutoModelForCausalLM

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


def check_model_spec(spec: ModelSpec) -> list[tuple[str, str]]:
    """Errors in the ``model`` section that the schema cannot see (unknown builtin, unknown config fields)."""
    errors: list[tuple[str, str]] = []
    if spec.builtin == VISION_BUILTIN or getattr(spec, "text", None) or getattr(spec, "vision", None):
        return check_vision_spec(spec)
    if spec.builtin is None:
        return errors
    if spec.builtin not in BUILTIN_MODELS:
        known = BUILTIN_MODELS.names()
        errors.append(
            (
                "model.builtin",
                f"unknown builtin model {spec.builtin!r}{suggest(spec.builtin, known)}; known: {', '.join(known)}",
            )
        )
        return errors
    arch = BUILTIN_MODELS.get(spec.builtin)
    config_class = _config_class(arch.model_type)
    # The config's own fields, and the generic aliases it maps (GPT-2: hidden_size → n_embd, …).
    known_fields = list(config_class().to_dict()) + list(getattr(config_class, "attribute_map", {}) or {})
    for key in spec.config:
        if key not in known_fields:
            errors.append(
                (f"model.config.{key}", f"not a field of the {arch.model_type} config{suggest(key, known_fields)}")
            )
    if not errors:
        errors += model_config_errors(spec, arch, config_class)
    return errors


def check_vision_spec(spec) -> list[tuple[str, str]]:
    """Errors of the vision fields: ``text`` / ``vision`` only with llava-tiny, a known text builtin, known
    vision config fields."""
    from transformers import SiglipVisionConfig

    if spec.builtin != VISION_BUILTIN:
        return [
            (f"model.{key}", f"applies to builtin {VISION_BUILTIN} only")
            for key in ("text", "vision")
            if getattr(spec, key)
        ]
    if (spec.text or DEFAULT_TEXT) == VISION_BUILTIN:
        return [("model.text", f"must be a text architecture, not {VISION_BUILTIN}")]
    errors = [
        (key.replace("model.builtin", "model.text"), message) for key, message in check_model_spec(text_spec(spec))
    ]
    known = set(SiglipVisionConfig().to_dict()) | {"pixel_gain"}
    errors += [
        (f"model.vision.{key}", "not a field of the siglip_vision_model config")
        for key in spec.vision
        if key not in known
    ]
    vision = {**VISION_DEFAULTS, **spec.vision}
    gain = vision.get("pixel_gain", 1.0)
    if not errors and (not isinstance(gain, (int, float)) or gain <= 0):
        errors.append(("model.vision.pixel_gain", "must be a positive number"))
    if not errors and vision["image_size"] % vision["patch_size"]:
        errors.append(("model.vision.patch_size", f"must divide image_size ({vision['image_size']})"))
    return errors


class ModelCheck(Plugin):
    """A check of the ``model`` section run at validation: ``check(spec) -> [(yaml_path, message)]``; the registry
    holds one instance (built from the default ``Params``), called as ``MODEL_CHECKS.get(name)(spec)``."""

    def __init__(self, params: Any = None):
        self.params = params if params is not None else self.Params()

    def check(self, spec: ModelSpec) -> Errors:
        raise NotImplementedError

    def __call__(self, spec: ModelSpec) -> Errors:
        return self.check(spec)


@MODEL_CHECKS.plugin("model")
class ModelSectionCheck(ModelCheck):
    """The builtin / HF / image-text checks of this module (:func:`check_model_spec`)."""

    def check(self, spec: ModelSpec) -> Errors:
        return check_model_spec(spec)
