"""Errors of YAML files: :class:`ConfigError` (every error with its YAML path) and the one translator of pydantic's
validation errors into ``(yaml_path, message)`` pairs, used for experiments, recipe params and sweep files alike.

The translator walks the schema along each error's location, so it can

- drop the tags of discriminated unions from the path (pydantic puts the variant's tag in the location, the YAML
  has no such key: ``space.<path>.float.lg`` is written ``space.<path>.lg``);
- suggest the nearest key for an unknown one, from the fields (by their YAML name, the alias when there is one) of
  the model the key was written in;
- say which values a literal allows (``unknown value 'tpee' (did you mean 'tpe'?); use tpe, random, gp, nsga2``).
"""

from __future__ import annotations

import re
import types
import typing
from typing import Annotated, Any, Union

from pydantic import BaseModel, Tag, ValidationError

from harness.config.paths import format_path
from harness.core.registry import suggest

_UNION_TYPES = (Union, types.UnionType)  # ``Optional[X]`` and ``X | None``


class ConfigError(Exception):
    """An invalid experiment file; ``errors`` holds ``(yaml_path, message)`` pairs, ``str()`` the report."""

    def __init__(self, source: str, errors: list[tuple[str, str]]):
        self.source, self.errors = source, errors
        lines = [f"{source}: {len(errors)} error{'s' if len(errors) != 1 else ''}"]
        lines += [f"  {path}: {message}" if path else f"  {message}" for path, message in errors]
        super().__init__("\n".join(lines))

    def __reduce__(self):  # pickles with its constructor's arguments (harness repro --jobs sends it back)
        return type(self), (self.source, self.errors)


def _unwrap(annotation: Any) -> Any:
    """``annotation`` without ``Annotated`` metadata and without ``Optional``."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in _UNION_TYPES:
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation


def _tagged_variants(annotation: Any) -> dict[str, Any]:
    """``{tag: variant}`` of a discriminated union (members written ``Annotated[cls, Tag(tag)]``), else empty."""
    if typing.get_origin(annotation) not in _UNION_TYPES:
        return {}
    variants = {}
    for member in typing.get_args(annotation):
        if typing.get_origin(member) is Annotated:
            cls, *metadata = typing.get_args(member)
            variants.update((m.tag, cls) for m in metadata if isinstance(m, Tag))
    return variants


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _yaml_fields(model: type[BaseModel]) -> dict[str, Any]:
    """The model's fields by the key written in YAML (the alias when there is one)."""
    return {info.alias or name: info for name, info in model.model_fields.items()}


def _locate(schema: type[BaseModel], loc: tuple[Any, ...]) -> tuple[list[Any], type[BaseModel] | None]:
    """The YAML path of a pydantic error location (union tags dropped) and the model its last key belongs to
    (None where the schema cannot tell: free-form dicts, plain unions)."""
    path: list[Any] = []
    current: Any = schema
    owner: type[BaseModel] | None = None
    for part in loc:
        current = _unwrap(current)
        variants = _tagged_variants(current)
        if isinstance(part, str) and part in variants:
            current = variants[part]
            continue
        path.append(part)
        owner = current if _is_model(current) else None
        if owner is not None:
            info = _yaml_fields(owner).get(part) if isinstance(part, str) else None
            current = info.annotation if info is not None else None
        elif typing.get_origin(current) in (list, dict):
            current = typing.get_args(current)[-1]
        else:
            current = None
    return path, owner


def _literal_choices(error: dict[str, Any]) -> list[str]:
    """The allowed values of a ``literal_error``, from pydantic's ``'a', 'b' or 'c'``."""
    return re.findall(r"'([^']*)'", str(error.get("ctx", {}).get("expected", "")))


def yaml_errors(exc: ValidationError, schema: type[BaseModel]) -> list[tuple[str, str]]:
    """pydantic's errors for a mapping validated by ``schema`` as ``(yaml_path, message)`` pairs, in its order."""
    out = []
    for e in exc.errors():
        path, owner = _locate(schema, tuple(e["loc"]))
        where = format_path(path)
        if e["type"] == "extra_forbidden":
            known = list(_yaml_fields(owner)) if owner is not None else []
            key = str(path[-1])
            hint = suggest(key, known)
            out.append((where, f"unknown key {key!r}" + (hint or (f"; allowed: {', '.join(known)}" if known else ""))))
        elif e["type"] == "missing":
            out.append((where, "required field is missing"))
        elif e["type"] == "literal_error" and _literal_choices(e):
            choices = _literal_choices(e)
            out.append(
                (where, f"unknown value {e['input']!r}{suggest(str(e['input']), choices)}; use " + ", ".join(choices))
            )
        else:
            message = e["msg"]
            out.append((where, message[len("Value error, ") :] if message.startswith("Value error, ") else message))
    return out
