"""Loader recipes (``jsonl``, ``parquet``, ``hf``): bring a user's dataset in through ``datasets.load_dataset`` and
map its columns onto chat examples.

Field mapping (column names): ``prompt`` + ``answer`` for single-turn data, or ``messages`` for conversations —
a list of ``{role, content}`` (roles user / assistant / system) or ShareGPT ``{from, value}`` (human / gpt /
system) — plus an optional ``system`` column whose text becomes a leading system message.

Splits: rows are shuffled by the seed; ``heldout`` takes the first ``n_eval`` (distinct content), ``train`` the
next ``n_train`` rows whose content is not in ``heldout``. ``heldout_template`` is always **empty**: a user's
dataset has no notion of templates. Rows are checked as they are taken: an empty answer, a conversation that
does not alternate user/assistant and end with the assistant, or an unknown role is a ``ValueError`` naming the
file and row (``skip_invalid: true`` drops such rows instead). ``datasets`` is imported only here, lazily.

Types: mapped fields must hold text. ``42``, ``true`` or ``{"x": 1}`` in a prompt / answer / system / turn field is
an error naming the row and field (``cast_to_string: true`` turns numbers and booleans into their JSON text;
mappings and lists are never text). JSON-lines files are first read line by line, so an empty file, a malformed
line, invalid UTF-8 or a lone surrogate is reported as ``FILE:LINE: why`` rather than as Arrow's error.

Paths: a relative ``path`` (or a local ``id`` directory) is relative to the experiment file's directory when the
harness passes one (:meth:`DatasetLoader.resolve_paths`), not to the current directory.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from typing import Any, ClassVar

from pydantic import Field, model_validator

from data_recipes._registry import register
from data_recipes._rowcheck import RowProblem, field_text, scan_jsonl
from data_recipes.base import Example, Recipe, RecipeParams

ROLES = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "system": "system",
}
CHUNK = 1024  # rows converted to Python at a time


class LoaderParams(RecipeParams):
    prompt: str | None = Field(None, description="Column holding the user prompt (with answer).")
    answer: str | None = Field(None, description="Column holding the gold answer (with prompt).")
    messages: str | None = Field(
        None,
        description="Column holding a conversation ({role, content} or "
        "ShareGPT {from, value} turns); instead of prompt/answer.",
    )
    system: str | None = Field(None, description="Optional column whose text becomes a leading system message.")
    skip_invalid: bool = Field(
        False,
        description="Drop rows with an empty answer or a malformed conversation "
        "instead of failing (a file that cannot be parsed, or a field "
        "that is not text, still fails).",
    )
    cast_to_string: bool = Field(
        False,
        description="Turn numbers and booleans in mapped fields into text (42 → "
        "'42', true → 'true') instead of rejecting the row.",
    )

    @model_validator(mode="after")
    def _mapping(self) -> LoaderParams:
        if self.messages and (self.prompt or self.answer):
            raise ValueError("map either messages, or prompt and answer, not both")
        if not self.messages and not (self.prompt and self.answer):
            raise ValueError("map the dataset's columns: give prompt and answer (column names), or messages")
        return self


class FileParams(LoaderParams):
    path: str = Field(..., description="The data file (a glob is allowed).")


class HFParams(LoaderParams):
    id: str = Field(..., description="Hub dataset id, a local dataset directory, or a save_to_disk directory.")
    split: str = Field("train", description="Split to read (slices like train[:1000] work for load_dataset).")
    name: str | None = Field(None, description="Dataset config name.")
    revision: str | None = Field(None, description="Git revision of a hub dataset.")
    trust_remote_code: bool = Field(False, description="Allow a dataset's own loading script (off by default).")


_Invalid = RowProblem  # a row that cannot become an example; the message says why


def resolve_data_path(path: str, base_dir: str | None) -> str:
    """``path`` made absolute against ``base_dir`` (the experiment file's directory) when it is relative; globs
    are kept as globs. Without a base directory the path is left as given (relative to the current directory)."""
    if base_dir is None or os.path.isabs(os.path.expanduser(path)):
        return os.path.expanduser(path)
    return os.path.normpath(os.path.join(base_dir, path))


class DatasetLoader(Recipe):
    """Base of the loaders: subclasses implement :meth:`_load` and :meth:`_source`."""

    heldout_overlap = "prompt_answer"  # one prompt may carry several answers; identical rows never straddle the split
    rebuild_check = False  # the split check reads the file once: the shuffle is seeded by construction

    reads_files: ClassVar[bool] = True  # tells the harness the params name files (resolve paths, hash contents)
    Params: ClassVar[type[LoaderParams]] = LoaderParams

    @classmethod
    def resolve_paths(cls, params: dict[str, Any], base_dir: str | None) -> dict[str, Any]:
        """``params`` (the raw mapping from the experiment) with file paths resolved against ``base_dir``."""
        return dict(params)

    def _source(self) -> str:
        raise NotImplementedError

    def _load(self):
        raise NotImplementedError

    def _fail(self, what: str) -> ValueError:
        return ValueError(f"{self.name}: {self._source()}: {what}")

    # --- rows → examples -----------------------------------------------------------------------------------

    def _turns(self, row: dict[str, Any]) -> list[dict[str, str]]:
        p = self.params
        if p.messages:
            raw = row[p.messages]
            if not isinstance(raw, list) or not raw:
                raise _Invalid(f"column {p.messages!r} is not a non-empty list of turns")
            turns = []
            for turn in raw:
                if not isinstance(turn, dict):
                    raise _Invalid(f"column {p.messages!r} holds a turn that is not a mapping: {turn!r}")
                role = turn.get("role") if turn.get("role") is not None else turn.get("from")
                content = turn.get("content") if turn.get("content") is not None else turn.get("value")
                if not isinstance(role, str) or role not in ROLES:
                    raise _Invalid(
                        f"column {p.messages!r} has a turn with unknown role {role!r} "
                        f"(known: {', '.join(sorted(ROLES))})"
                    )
                text = field_text(content, f"{p.messages}[{len(turns)}].content", p.cast_to_string)
                turns.append({"role": ROLES[role], "content": text})
        else:
            turns = [
                {"role": "user", "content": field_text(row[p.prompt], p.prompt, p.cast_to_string)},
                {"role": "assistant", "content": field_text(row[p.answer], p.answer, p.cast_to_string)},
            ]
        system = field_text(row[p.system], p.system, p.cast_to_string) if p.system else ""
        if system.strip() and turns[0]["role"] != "system":
            turns.insert(0, {"role": "system", "content": system})
        return turns

    def _check(self, turns: list[dict[str, str]]) -> None:
        p = self.params
        body = turns[1:] if turns and turns[0]["role"] == "system" else turns
        roles = [t["role"] for t in body]
        if not roles or roles != ["user", "assistant"] * (len(roles) // 2):
            raise _Invalid(
                f"column {p.messages!r}: turns must alternate user/assistant, starting with the user and "
                f"ending with the assistant; got {' → '.join(roles) or 'none'}"
            )
        for t in body:
            if not t["content"].strip():
                field = p.messages or (p.answer if t["role"] == "assistant" else p.prompt)
                kind = "answer" if t["role"] == "assistant" else "prompt"
                raise _Invalid(f"empty {kind} (column {field!r})")

    def _rows(self, ds, order: list[int]) -> Iterator[tuple[int, dict[str, Any]]]:
        for start in range(0, len(order), CHUNK):
            chunk = order[start : start + CHUNK]
            yield from zip(chunk, ds.select(chunk).to_list())

    def build(self, task: str, n_train: int, n_eval: int, seed: int) -> dict[str, list[Example]]:
        ds = self._load()
        if len(ds) == 0:
            raise self._fail("no rows")
        columns = list(ds.column_names)
        for field in ("prompt", "answer", "messages", "system"):
            column = getattr(self.params, field)
            if column is not None and column not in columns:
                raise self._fail(f"no column {column!r} (params.{field}); available columns: {', '.join(columns)}")
        ds = ds.select_columns(
            [
                c
                for c in (self.params.prompt, self.params.answer, self.params.messages, self.params.system)
                if c is not None
            ]
        )
        order = list(range(len(ds)))
        random.Random(f"{self.name}:{seed}").shuffle(order)

        heldout: list[Example] = []
        train: list[Example] = []
        heldout_keys: set[str] = set()
        skipped = duplicates = 0
        for index, row in self._rows(ds, order):
            if len(heldout) >= n_eval and len(train) >= n_train:
                break
            try:
                turns = self._turns(row)
                self._check(turns)
            except _Invalid as e:
                if self.params.skip_invalid:
                    skipped += 1
                    continue
                raise self._fail(f"row {index}: {e}") from None
            key = json.dumps(turns, sort_keys=True)
            if key in heldout_keys:  # identical content may not sit on both sides of the split
                duplicates += 1
                continue
            ex = Example(
                task, tuple(turns), {"item": f"row{index}", "template": "", "row": index, "dataset": self._source()}
            )
            if len(heldout) < n_eval:
                heldout.append(ex)
                heldout_keys.add(key)
            else:
                train.append(ex)
        if len(heldout) < n_eval or len(train) < n_train:
            raise self._fail(
                f"{n_train} train + {n_eval} heldout examples asked for, but the data has {len(ds)} rows"
                + (f" ({skipped} invalid skipped)" if skipped else "")
                + (f" ({duplicates} duplicates of held-out rows)" if duplicates else "")
            )
        return {"train": train, "heldout": heldout, "heldout_template": []}


class _FileLoader(DatasetLoader):
    Params = FileParams
    example_params: ClassVar[dict[str, Any]] = {"path": "train.jsonl", "prompt": "q", "answer": "a"}  # no defaults
    builder: ClassVar[str]

    @classmethod
    def resolve_paths(cls, params: dict[str, Any], base_dir: str | None) -> dict[str, Any]:
        resolved = dict(params)
        if isinstance(resolved.get("path"), str):
            resolved["path"] = resolve_data_path(resolved["path"], base_dir)
        return resolved

    def _source(self) -> str:
        return self.params.path

    def _prescan(self, path: str) -> None:
        """Format-specific checks before Arrow reads the file (JSON lines: see :func:`scan_jsonl`)."""

    def _load(self):
        import datasets

        datasets.disable_progress_bars()  # a progress bar per file load is noise on the console
        path = self.params.path
        if not any(ch in path for ch in "*?[") and not os.path.isfile(path):
            raise self._fail(f"file not found (params.path{', cwd ' + os.getcwd() if not os.path.isabs(path) else ''})")
        self._prescan(path)
        try:
            return datasets.load_dataset(self.builder, data_files=path, split="train")
        except FileNotFoundError as e:
            raise self._fail(f"file not found (params.path): {e}") from None
        except Exception as e:  # a parse error of the file: say which file
            raise self._fail(f"cannot read it as {self.builder}: {type(e).__name__}: {e}") from None


@register("jsonl")
class JsonlLoader(_FileLoader):
    """A JSON-lines (or JSON) file, one example per line."""

    builder = "json"

    def _prescan(self, path: str) -> None:
        p = self.params
        try:
            scan_jsonl(path, [f for f in (p.prompt, p.answer, p.system) if f], p.messages, p.cast_to_string)
        except ValueError as e:
            raise ValueError(f"{self.name}: {e}") from None


@register("parquet")
class ParquetLoader(_FileLoader):
    """A parquet file (or glob of files)."""

    builder = "parquet"

    def _prescan(self, path: str) -> None:
        import glob as globlib

        import pyarrow.parquet as pq

        files = sorted(globlib.glob(path)) if globlib.has_magic(path) else [path]
        try:
            rows = sum(pq.read_metadata(f).num_rows for f in files)
        except Exception:  # not parquet at all: let datasets give its own reason
            return
        if rows == 0:  # datasets would say 'Instruction "train" corresponds to no data!'
            raise self._fail("no rows")


@register("hf")
class HFLoader(DatasetLoader):
    """A hub dataset id, a local dataset directory (data files ``load_dataset`` understands), or a directory
    written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (read with ``load_from_disk``)."""

    example_params: ClassVar[dict[str, Any]] = {"id": "org/dataset", "prompt": "q", "answer": "a"}  # no defaults
    Params = HFParams

    @classmethod
    def resolve_paths(cls, params: dict[str, Any], base_dir: str | None) -> dict[str, Any]:
        """A relative ``id`` that names a directory next to the experiment file becomes its absolute path; any
        other id (``user/dataset`` on the hub) is left as it is."""
        resolved = dict(params)
        raw = resolved.get("id")
        if isinstance(raw, str) and base_dir is not None and not os.path.isabs(raw):
            candidate = resolve_data_path(raw, base_dir)
            if os.path.exists(candidate):
                resolved["id"] = candidate
        return resolved

    def _source(self) -> str:
        return self.params.id + (f" ({self.params.name})" if self.params.name else "") + f" [{self.params.split}]"

    def _load(self):
        import inspect

        import datasets

        datasets.disable_progress_bars()
        p = self.params
        if os.path.isdir(p.id) and (
            os.path.isfile(os.path.join(p.id, "state.json")) or os.path.isfile(os.path.join(p.id, "dataset_dict.json"))
        ):
            loaded = datasets.load_from_disk(p.id)
            if isinstance(loaded, datasets.DatasetDict):
                if p.split not in loaded:
                    raise self._fail(f"no split {p.split!r}; available splits: {', '.join(loaded)}")
                loaded = loaded[p.split]
            return loaded
        kwargs: dict[str, Any] = {"name": p.name, "split": p.split, "revision": p.revision}
        if p.trust_remote_code:
            if "trust_remote_code" not in inspect.signature(datasets.load_dataset).parameters:
                raise self._fail(
                    f"trust_remote_code is set, but datasets {datasets.__version__} no longer runs "
                    "dataset scripts; use a dataset stored as data files"
                )
            kwargs["trust_remote_code"] = True
        try:
            return datasets.load_dataset(p.id, **kwargs)
        except Exception as e:  # not found, unknown split or config, no network: keep datasets' reason
            raise self._fail(f"cannot load it: {type(e).__name__}: {e}") from None
