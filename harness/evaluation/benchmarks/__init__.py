"""lm-evaluation-harness tasks run on the in-memory model during training (``eval.benchmarks``), as store rows with
intervals and per-document outcomes.

lm-eval's documented API, nothing else: ``HFLM(pretrained=<model object>, tokenizer=<tokenizer object>)`` (so
nothing is loaded from a hub: the model and tokenizer are the run's own), ``TaskManager(include_path=[...])`` (the
user's YAML tasks and the shipped offline ones) and ``simple_evaluate(..., log_samples=True)`` once per
benchmark, with its ``limit`` and ``num_fewshot``.

Rows (the metric contract's shape, :mod:`harness.core.metrics`): task ``bench:<lm-eval task>``, split ``bench``,
metric lm-eval's metric name (``acc``; ``acc:<filter>`` for a filter other than ``none``). A metric whose every
per-document value is 0 or 1 gets ``n`` and the Wilson interval from those outcomes, which also go to
``samples.jsonl`` as ``outcomes`` (so the paired seesaw test covers benchmarks); any other gets lm-eval's
``stderr`` as a normal 95 % interval. A group (``mmlu``) gives its own rows and each subtask's.

The shipped offline tasks ``world_mc`` / ``world_gen`` (YAMLs beside this file) read rows generated from the run's
synthetic world (:mod:`data_recipes.world_bench`); :func:`materialise` writes rows and YAMLs into the run
directory. lm-eval is imported on first use only (the ``benchmarks`` extra).

Several ranks: rank 0 alone runs lm-eval on its own replica of the unwrapped model (DDP keeps a whole copy on every
rank); the others go on and wait for it at the next gradient all-reduce. FSDP is refused at validation.
"""

from __future__ import annotations

import json
import math
import numbers
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_recipes.world_bench import WORLD_BENCHMARKS
from harness.core.metrics import BENCH_SPLIT, BENCH_TASK_PREFIX

HERE = Path(__file__).resolve().parent
#: Documents generated for a shipped world task when its ``limit`` is null
WORLD_DEFAULT_DOCS = 200
_Z95 = 1.959963984540054


def materialise(specs: list, world: Any, directory: Path) -> Path:
    """Write the shipped world tasks that ``specs`` name (rows as JSON lines, the YAML with its data file made
    absolute) into ``directory``; returns it (an ``include_path`` for lm-eval's task manager)."""
    import yaml

    directory.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        make = WORLD_BENCHMARKS.get(spec.task)
        if make is None:
            continue
        rows = make(world, spec.limit or WORLD_DEFAULT_DOCS)
        data = directory / f"{spec.task}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        config = yaml.safe_load((HERE / f"{spec.task}.yaml").read_text())
        config["dataset_kwargs"]["data_files"]["test"] = str(data)
        (directory / f"{spec.task}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return directory


@dataclass
class BenchmarkResult:
    """``rows``: ``(task, split, metric, value, n, low, high)``; ``samples``: ``samples.jsonl`` records."""

    rows: list[tuple] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Benchmarks:
    """The benchmarks of one run: which are due at an evaluation, and running them."""

    specs: list
    include_paths: list[str]
    tokenizer: Any
    batch_size: int = 16
    stage_edges: frozenset[int] = frozenset()  # global steps where a stage ends (and 0, the run's start)
    _manager: Any = None
    _lm: Any = None  # (model, its HFLM)

    def due(self, step: int) -> list:
        return [s for s in self.specs if (step in self.stage_edges if s.every == "stage_end" else step % s.every == 0)]

    def manager(self):
        """lm-eval's task index over its own tasks and the include paths (built once: it reads every YAML)."""
        if self._manager is None:
            from lm_eval.tasks import TaskManager

            self._manager = TaskManager(include_path=self.include_paths or None)
        return self._manager

    def unknown(self) -> list[tuple[int, str]]:
        """``(index, message)`` for every spec whose task lm-eval does not know, with a near-miss suggestion."""
        from harness.core.registry import suggest

        known = self.manager().all_tasks
        return [
            (i, f"unknown lm-eval task {s.task!r}{suggest(s.task, known)}")
            for i, s in enumerate(self.specs)
            if s.task not in known
        ]

    def run(self, model, specs: list | None = None) -> BenchmarkResult:
        """Every spec of ``specs`` (default: all) on ``model``; the model's modes and every global RNG are as they
        were afterwards (``simple_evaluate`` seeds python, numpy and torch: training must not feel that)."""
        from lm_eval import simple_evaluate
        from lm_eval.models.huggingface import HFLM

        out = BenchmarkResult()
        modes = [(module, module.training) for module in model.modules()]
        with _rng_kept(), _quiet():
            try:
                if self._lm is None or self._lm[0] is not model:  # one wrapper per model object (a stage may
                    # hand on a new one: an adapter wrapped around it)
                    self._lm = (
                        model,
                        HFLM(
                            pretrained=model,
                            tokenizer=self.tokenizer,
                            batch_size=self.batch_size,
                            max_length=_max_length(model),
                        ),
                    )
                lm = self._lm[1]
                for spec in self.specs if specs is None else specs:
                    results = simple_evaluate(
                        model=lm,
                        tasks=[spec.task],
                        task_manager=self.manager(),
                        limit=spec.limit,
                        num_fewshot=spec.num_fewshot,
                        log_samples=True,
                        bootstrap_iters=1000,
                    )
                    rows, samples = result_rows(results)
                    out.rows += rows
                    out.samples += samples
            finally:
                for module, training in modes:
                    module.training = training
        return out


def _max_length(model) -> int | None:
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions", "n_ctx"):
        if isinstance(getattr(config, name, None), int):
            return getattr(config, name)
    return None


class _quiet:
    """lm-eval's INFO and WARNING logs (one warning per wrapper about passing a model object, which is the point)
    silenced while it runs; its errors still show."""

    def __enter__(self):
        import logging

        self.logger = logging.getLogger("lm_eval")
        self.level = self.logger.level
        self.logger.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        self.logger.setLevel(self.level)
        return False


class _rng_kept:
    """Python's, numpy's and torch's (CPU and CUDA) global RNG states restored on exit."""

    def __enter__(self):
        import numpy as np
        import torch

        self.states = (
            random.getstate(),
            np.random.get_state(),
            torch.get_rng_state(),
            torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        )

    def __exit__(self, *exc):
        import numpy as np
        import torch

        python, numpy_state, cpu, cuda = self.states
        random.setstate(python)
        np.random.set_state(numpy_state)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        return False


def result_rows(results: dict[str, Any]) -> tuple[list[tuple], list[dict[str, Any]]]:
    """Store rows and sample records from one ``simple_evaluate`` result (see the module docstring)."""
    samples = results.get("samples") or {}
    rows, records = [], []
    for name, entry in results["results"].items():
        task = BENCH_TASK_PREFIX + name
        docs = samples.get(name) or []
        outcomes: dict[str, dict[int, float]] = {}
        for key, value in entry.items():
            if "," not in key or key.split(",")[0].endswith("_stderr") or not _number(value):
                continue
            metric_name, filter_name = key.split(",", 1)
            metric = metric_name if filter_name == "none" else f"{metric_name}:{filter_name}"
            per_doc = {
                d["doc_id"]: float(d[metric_name])
                for d in docs
                if d.get("filter") == filter_name and _number(d.get(metric_name))
            }
            stderr = entry.get(f"{metric_name}_stderr,{filter_name}")
            rows.append((task, BENCH_SPLIT, metric, float(value), *_interval(per_doc, float(value), stderr, entry)))
            if per_doc and all(v in (0.0, 1.0) for v in per_doc.values()):
                outcomes[metric] = per_doc
        # one record per document (lm-eval logs one per filter): the unfiltered one when there is one, with the
        # outcomes of every filter's metrics
        first: dict[int, dict[str, Any]] = {}
        for d in sorted(docs, key=lambda d: d.get("filter") != "none"):
            first.setdefault(d["doc_id"], d)
        for doc_id, d in sorted(first.items()):
            records.append(_sample(task, d, {m: int(v[doc_id]) for m, v in outcomes.items() if doc_id in v}))
    return rows, records


def _number(value: Any) -> bool:
    """A finite real number (numpy's included; not a bool, not lm-eval's "N/A")."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def _interval(per_doc: dict[int, float], value: float, stderr: Any, entry: dict[str, Any]) -> tuple:
    """``(n, low, high)``: Wilson from 0/1 per-document outcomes, else value ± 1.96 · lm-eval's stderr."""
    from harness.core.stats import wilson_interval

    if per_doc and all(v in (0.0, 1.0) for v in per_doc.values()):
        ci = wilson_interval(int(sum(per_doc.values())), len(per_doc))
        return ci.n, ci.low, ci.high
    n = len(per_doc) or entry.get("sample_len")
    if _number(stderr):
        return n, value - _Z95 * float(stderr), value + _Z95 * float(stderr)
    return n, None, None


def _sample(task: str, doc: dict[str, Any], outcomes: dict[str, int]) -> dict[str, Any]:
    """A ``samples.jsonl`` record of one document: its prompt, gold target, prediction and 0/1 outcomes."""
    arguments = doc.get("arguments") or [[""]]
    responses = doc.get("filtered_resps") or []
    gold = doc.get("target")
    if responses and all(isinstance(r, (list, tuple)) and len(r) == 2 for r in responses):  # log-likelihoods

        def choice(i: int) -> str:
            return str(arguments[i][1]) if len(arguments[i]) > 1 else str(i)

        pred = choice(max(range(len(responses)), key=lambda i: responses[i][0]))
        if isinstance(gold, int) and 0 <= gold < len(arguments):
            gold = choice(gold)
    else:
        pred = str(responses[0]) if responses else None
    record = {
        "task": task,
        "split": BENCH_SPLIT,
        "index": doc["doc_id"],
        "prompt": str(arguments[0][0]),
        "gold": str(gold),
        "pred": pred,
    }
    if outcomes:
        record["correct"] = bool(next(iter(outcomes.values())))
        record["outcomes"] = outcomes
    return record
