"""Analyses of metric frames (one or many runs): stage-end tables, seesaw events, the first-token timeline,
run-to-run deltas and the worst failures from the sample tables.

Every function takes the long frame of :func:`analysis.load_runs` / :func:`analysis.load_run` (or paths, loaded
for you) and returns a polars frame.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from analysis.evidence import EVENT_SCHEMA, above_baseline, baselines, stored_seesaw_events
from analysis.loading import AnalysisError, PathLike, as_frame, load_run, load_samples, read_config
from harness.core.seesaw_families import EVENT_METRICS
from harness.core.store import LOWER_IS_BETTER as STORE_LOWER_IS_BETTER

ALPHA = 0.05  # false-discovery rate of "above its baseline" over one run's tasks (Benjamini–Hochberg)
# Trial columns where smaller is better, beside the store's LOWER_IS_BETTER (a live view of the declared metrics).
TRIAL_LOWER_IS_BETTER = frozenset({"duration_s", "pruned_step"})
# Per-task evaluation metrics of the contract, in display order.
EVAL_METRICS = (
    "greedy",
    "answer_ok",
    "mode_ok",
    "tf_first",
    "tf_exact",
    "eval_loss",
    "ft_rank_mean",
    "ft_rank_median",
    "ft_mrr",
    "ft_hijack",
    "ft_top1",
    "ft_nonfinite",
)
HIJACK_METRICS = ("ft_hijack", "ft_rank_mean", "ft_rank_median", "ft_mrr", "tf_first")
COMPARE_METRICS = ("greedy", "mode_ok", "tf_first", "ft_rank_median", "ft_hijack")

RunsLike = pl.DataFrame | pl.LazyFrame | PathLike | Sequence[PathLike]


def lower_is_better(metric: str) -> bool:
    """Whether smaller is better for ``metric`` (a name, or a column such as ``metric/s/heldout/yesno/loss``)."""
    name = metric.rsplit("/", 1)[-1]
    return name in TRIAL_LOWER_IS_BETTER or name in STORE_LOWER_IS_BETTER


def _with_run_id(frame: pl.DataFrame) -> pl.DataFrame:
    return frame if "run_id" in frame.columns else frame.with_columns(pl.lit("run").alias("run_id"))


def stage_bounds(runs: RunsLike) -> pl.DataFrame:
    """One row per (run, stage), in curriculum order: ``run_id, stage, index, start, end`` (first and last step
    with a row for the stage). A stage that starts from the previous one's weights starts where it ended."""
    frame = _with_run_id(as_frame(runs))
    if frame.is_empty():
        return pl.DataFrame(
            schema={"run_id": pl.Utf8, "stage": pl.Utf8, "index": pl.Int64, "start": pl.Int64, "end": pl.Int64}
        )
    bounds = (
        frame.with_row_index("_row")
        .group_by("run_id", "stage")
        .agg(
            pl.col("step").min().alias("start"), pl.col("step").max().alias("end"), pl.col("_row").min().alias("_first")
        )
        .sort("run_id", "start", "end", "_first")
        .with_columns(pl.int_range(pl.len()).over("run_id").cast(pl.Int64).alias("index"))
    )
    return bounds.select("run_id", "stage", "index", pl.col("start").cast(pl.Int64), pl.col("end").cast(pl.Int64))


def _stage_index(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with a ``stage_index`` column (curriculum order within each run)."""
    bounds = stage_bounds(frame).select("run_id", "stage", pl.col("index").alias("stage_index"))
    return _with_run_id(frame).join(bounds, on=["run_id", "stage"], how="left")


def eval_rows(
    runs: RunsLike,
    metrics: Iterable[str] | None = None,
    split: str | Sequence[str] | None = None,
    *,
    dedupe: bool = True,
) -> pl.DataFrame:
    """Per-task evaluation rows (``task`` not null, ``split`` an evaluation split), ordered by run, step and stage.

    With ``dedupe``, the evaluation a stage repeats from the previous stage's end (``init: previous``) is dropped,
    so every evaluation appears once, labelled with the stage that produced it; a stage restarting from other
    weights (``init: base``) keeps both points at its first step.
    """
    frame = _stage_index(as_frame(runs))
    frame = frame.filter(
        pl.col("task").is_not_null(),
        ~pl.col("metric").str.starts_with("mix_"),
        ~pl.col("metric").str.starts_with("baseline_"),
        pl.col("metric") != "seesaw",
    )
    # The training loss per task lives on split "train" (the evaluation loss is ``eval_loss``; older stores called
    # it ``loss`` on the evaluation splits).
    frame = frame.filter(~((pl.col("split") == "train") & (pl.col("metric") == "loss")))
    if metrics is not None:
        frame = frame.filter(pl.col("metric").is_in(list(metrics)))
    if split is not None:
        frame = frame.filter(pl.col("split").is_in([split] if isinstance(split, str) else list(split)))
    frame = frame.sort("run_id", "step", "stage_index", maintain_order=True)
    if dedupe and not frame.is_empty():
        frame = _drop_repeated_evaluations(frame)
    return frame


def _drop_repeated_evaluations(frame: pl.DataFrame) -> pl.DataFrame:
    """Drop the copies of an evaluation recorded again under the next stage at the same step (same values)."""
    key = ["run_id", "step", "split"]
    snap = (
        frame.group_by(*key, "stage", "stage_index")
        .agg(pl.struct("task", "metric", "value").sort_by("task", "metric").alias("_snap"))
        .sort(*key, "stage_index")
    )
    snap = snap.with_columns(pl.col("_snap").shift(1).over(key).alias("_prev"))
    repeated = snap.filter(pl.col("_prev").is_not_null() & (pl.col("_snap") == pl.col("_prev")))
    if repeated.is_empty():
        return frame
    return frame.join(repeated.select(*key, "stage"), on=[*key, "stage"], how="anti", maintain_order="left")


# ----------------------------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------------------------


def stage_table(runs: RunsLike, metric: str = "greedy", split: str = "heldout") -> pl.DataFrame:
    """The seed's comparison table for any runs: one row per (run, stage) in curriculum order, one column per
    task, holding ``metric`` on ``split`` at the stage's last evaluation (``run_id, stage, step, <task>…``)."""
    frame = eval_rows(runs, [metric], split, dedupe=False)
    if frame.is_empty():
        raise AnalysisError(f"no {metric!r} rows on split {split!r}")
    ends = frame.group_by("run_id", "stage").agg(pl.col("step").max().alias("_end"))
    last = (
        frame.join(ends, on=["run_id", "stage"])
        .filter(pl.col("step") == pl.col("_end"))
        .unique(["run_id", "stage", "task"], keep="last", maintain_order=True)
    )
    tasks = list(dict.fromkeys(last.sort("task")["task"].to_list()))
    table = last.pivot(
        on="task", index=["run_id", "stage_index", "stage", "step"], values="value", aggregate_function="last"
    )
    run_order = {r: i for i, r in enumerate(dict.fromkeys(frame["run_id"].to_list()))}
    table = (
        table.with_columns(pl.col("run_id").replace_strict(run_order, return_dtype=pl.Int64).alias("_run"))
        .sort("_run", "stage_index")
        .drop("_run", "stage_index")
    )
    return table.select("run_id", "stage", "step", *[t for t in tasks if t in table.columns])


def seesaw_events(runs: RunsLike, delta: float | None = None, metrics: Sequence[str] = EVENT_METRICS) -> pl.DataFrame:
    """Seesaw events of every run in the frame — between consecutive evaluations one task rose by ≥ δ while another
    fell by ≥ δ. By default of every family the run tested (:mod:`harness.core.seesaw_families`; ``metric`` names
    it): the events its console and ``summary.json`` list.

    A run that stored its own events (``eval.seesaw_test``; a ``seesaw_tests`` row says which rule) gives those —
    under the default paired rule, only changes significant on the items, with their BH-adjusted ``p_value`` —
    when ``delta`` is None or the run's own and ``metrics`` are among those the run tested. Otherwise (older runs,
    another δ, other metrics such as ``mode_ok``) the events are recomputed with the *untested* threshold rule
    (:func:`harness.core.seesaw.seesaw_events`; ``test = "none"``, no p-value; task–task only): the store keeps
    values, not the per-item outcomes a test needs (those are in ``samples.jsonl``).

    ``delta`` defaults to the run's ``eval.seesaw_delta`` when the frame came from :func:`load_runs` with config
    columns (else 0.15). Columns: ``run_id, metric, split, step_from, step_to, stage_from, stage_to, rose, rose_by,
    fell, fell_by, p_value, test``.
    """
    from harness.core.seesaw import seesaw_events as in_run_events

    frame = _with_run_id(as_frame(runs))
    columns = ["step", "stage", "task", "split", "metric", "value"]
    rows = []
    for run_id in dict.fromkeys(frame["run_id"].to_list()):
        run = frame.filter(pl.col("run_id") == run_id)
        stored = stored_seesaw_events(run, list(metrics), delta)
        if stored is not None:
            rows.extend({"run_id": run_id, **e} for e in stored)
            continue
        d = delta
        if d is None:
            d = (
                run["eval.seesaw_delta"].drop_nulls()[0]
                if "eval.seesaw_delta" in run.columns and run["eval.seesaw_delta"].drop_nulls().len()
                else 0.15
            )
        run = run.filter(pl.col("task").is_not_null(), pl.col("metric").is_in(list(metrics))).select(columns)
        rows.extend(
            {"run_id": run_id, **e, "p_value": None, "test": "none"} for e in in_run_events(run, float(d), metrics)
        )
    return pl.DataFrame([{k: r.get(k) for k in EVENT_SCHEMA} for r in rows], schema=EVENT_SCHEMA)


def hijack_timeline(runs: RunsLike, split: str | Sequence[str] | None = None) -> pl.DataFrame:
    """The first-token story over steps: one row per (run, step, stage, task, split) with ``ft_hijack`` (share of
    prompts whose top-1 first token is a hijack word), the gold first token's rank (``ft_rank_mean``,
    ``ft_rank_median``, ``ft_mrr``), ``tf_first``, and the most common top-1 first token (``top1``, with
    ``top1_count`` and ``top1_share``) from the ``ft_top1`` table."""
    frame = eval_rows(runs, [*HIJACK_METRICS, "ft_top1"], split)
    index = ["run_id", "step", "stage_index", "stage", "task", "split"]
    if frame.is_empty():
        raise AnalysisError("no first-token probe rows (ft_hijack, ft_rank_*): was the first_token probe on?")
    wide = frame.filter(pl.col("metric") != "ft_top1").pivot(
        on="metric", index=index, values="value", aggregate_function="last"
    )
    top = frame.filter(pl.col("metric") == "ft_top1")
    if not top.is_empty():
        parsed = [_top1(t) for t in top["text"].to_list()]
        top = top.select(*index, pl.col("value").alias("top1_share")).with_columns(
            pl.Series("top1", [p[0] for p in parsed], dtype=pl.Utf8),
            pl.Series("top1_count", [p[1] for p in parsed], dtype=pl.Int64),
        )
        top = top.unique(index, keep="last", maintain_order=True)
        wide = wide.join(top, on=index, how="left")
    for m in (*HIJACK_METRICS, "top1", "top1_count", "top1_share"):
        if m not in wide.columns:
            wide = wide.with_columns(pl.lit(None, dtype=pl.Utf8 if m == "top1" else pl.Float64).alias(m))
    return wide.sort("run_id", "step", "stage_index", "task", "split").select(
        "run_id", "stage", "step", "task", "split", *HIJACK_METRICS, "top1", "top1_count", "top1_share"
    )


def _top1(text: str | None) -> tuple[str | None, int | None]:
    try:
        pairs = json.loads(text) if text else []
    except json.JSONDecodeError:
        return None, None
    if not pairs:
        return None, None
    first = pairs[0]
    if isinstance(first, dict):
        return str(first.get("token")), int(first.get("count", 0))
    return str(first[0]), int(first[1])


def top1_table(runs: RunsLike, split: str, at: str = "stage_end", k: int = 3) -> pl.DataFrame:
    """The most common top-1 first tokens per task at each stage end: ``run_id, stage, step, task, tokens`` where
    ``tokens`` reads ``'yes'×10, 'No'×2``."""
    frame = eval_rows(runs, ["ft_top1"], split, dedupe=False)
    if frame.is_empty():
        return pl.DataFrame(
            schema={"run_id": pl.Utf8, "stage": pl.Utf8, "step": pl.Int64, "task": pl.Utf8, "tokens": pl.Utf8}
        )
    ends = frame.group_by("run_id", "stage").agg(pl.col("step").max().alias("_end"))
    last = frame.join(ends, on=["run_id", "stage"]).filter(pl.col("step") == pl.col("_end"))

    def fmt(text: str | None) -> str:
        try:
            pairs = json.loads(text) if text else []
        except json.JSONDecodeError:
            return ""
        cells = []
        for p in pairs[:k]:
            tok, n = (p.get("token"), p.get("count")) if isinstance(p, dict) else (p[0], p[1])
            cells.append(f"{tok!r}×{n}")
        return ", ".join(cells)

    return (
        last.with_columns(pl.col("text").map_elements(fmt, return_dtype=pl.Utf8).alias("tokens"))
        .sort("run_id", "stage_index", "task")
        .select("run_id", "stage", "step", "task", "tokens")
    )


def compare(
    run_a: RunsLike, run_b: RunsLike, metrics: Sequence[str] = COMPARE_METRICS, splits: Sequence[str] | None = None
) -> pl.DataFrame:
    """Per-task deltas at each stage end between two runs: ``stage, task, split, metric, a, b, delta`` (b − a),
    stages matched by name in run A's order (a stage only one run has gets a null on the other side)."""
    frame_a, frame_b = (_one_run(r) for r in (run_a, run_b))
    ends = []
    for frame in (frame_a, frame_b):
        rows = eval_rows(frame, metrics, splits, dedupe=False)
        last = rows.join(rows.group_by("stage").agg(pl.col("step").max().alias("_end")), on="stage")
        ends.append(
            last.filter(pl.col("step") == pl.col("_end"))
            .unique(["stage", "task", "split", "metric"], keep="last", maintain_order=True)
            .select("stage", "stage_index", "task", "split", "metric", "value")
        )
    a, b = ends
    key = ["stage", "task", "split", "metric"]
    joined = a.rename({"value": "a", "stage_index": "_ia"}).join(
        b.rename({"value": "b", "stage_index": "_ib"}), on=key, how="full", coalesce=True
    )
    metric_order = {m: i for i, m in enumerate(metrics)}
    joined = joined.with_columns(
        (pl.col("b") - pl.col("a")).alias("delta"),
        pl.coalesce(pl.col("_ia"), pl.col("_ib") + 1000).alias("_order"),
        pl.col("metric").replace_strict(metric_order, default=len(metric_order), return_dtype=pl.Int64).alias("_m"),
    )
    return joined.sort("_m", "split", "_order", "task").select(*key, "a", "b", "delta")


def _one_run(run: RunsLike) -> pl.DataFrame:
    frame = _with_run_id(as_frame(run))
    ids = frame["run_id"].unique().to_list()
    if len(ids) != 1:
        raise AnalysisError(f"compare takes one run per side; got {len(ids)} runs ({', '.join(map(str, ids[:4]))})")
    return frame


def format_compare(deltas: pl.DataFrame, name_a: str = "A", name_b: str = "B", threshold: float = 1e-9) -> str:
    """The deltas of :func:`compare` as text: one block per (metric, split), a row per task, a column per stage
    with ``a → b (Δ)`` and ▲ / ▼ where B is better / worse by more than ``threshold``."""
    if deltas.is_empty():
        return "nothing to compare (no common metrics)"
    lines = [f"A = {name_a}", f"B = {name_b}", ""]
    fmt = lambda v: "  -  " if v is None else f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"  # noqa: E731
    for (metric, split), block in deltas.group_by("metric", "split", maintain_order=True):
        stages = list(dict.fromkeys(block["stage"].to_list()))
        tasks = sorted(dict.fromkeys(block["task"].to_list()))
        better = "lower is better" if lower_is_better(metric) else "higher is better"
        lines.append(f"{metric} · {split}  ({better}; Δ = B − A; ▲ B better, ▼ B worse)")
        cells = {(r["stage"], r["task"]): r for r in block.iter_rows(named=True)}
        header = ["task", *stages]
        body = []
        for task in tasks:
            row = [task]
            for stage in stages:
                r = cells.get((stage, task))
                if r is None:
                    row.append("")
                    continue
                d = r["delta"]
                better = d is not None and ((d < 0) if lower_is_better(metric) else (d > 0))
                mark = "" if d is None or abs(d) <= threshold else (" ▲" if better else " ▼")
                row.append(f"{fmt(r['a'])} → {fmt(r['b'])} ({'' if d is None else f'{d:+.3f}'}){mark}")
            body.append(row)
        widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(len(header))]
        for r in [header, *body]:
            lines.append("  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------------------------------------------
# Samples
# ----------------------------------------------------------------------------------------------------------------


def worst_failures(run_dir: PathLike, n: int = 5, at: str = "final", split: str | None = None) -> pl.DataFrame:
    """The ``n`` worst failures per (task, split) at the run's last evaluation (``at="final"``) or at the end of a
    named stage: wrong answers, the most confidently wrong first (the gold first token ranked lowest), then the
    ones that broke the task's mode. Columns: ``task, split, stage, step, prompt, gold, pred, mode_ok,
    gold_first_rank, top5`` (a readable string), ``failures`` and ``items`` (counts at that evaluation)."""
    samples = load_samples(run_dir)
    if samples.is_empty():
        return samples
    if split is not None:
        samples = samples.filter(pl.col("split") == split)
    if at == "final":
        step = samples["step"].max()
        at_step = samples.filter(pl.col("step") == step)
        # The final evaluation may be recorded under two stage names: keep the last stage's copy.
        at_step = at_step.filter(pl.col("stage") == at_step["stage"][-1])
    else:
        in_stage = samples.filter(pl.col("stage") == at)
        if in_stage.is_empty():
            raise AnalysisError(f"no samples for stage {at!r}")
        at_step = in_stage.filter(pl.col("step") == in_stage["step"].max())
    for col, dtype in (("mode_ok", pl.Boolean), ("gold_first_rank", pl.Int64), ("pred", pl.Utf8)):
        if col not in at_step.columns:
            at_step = at_step.with_columns(pl.lit(None, dtype=dtype).alias(col))
    counts = at_step.group_by("task", "split").agg(
        (~pl.col("correct").fill_null(False)).sum().alias("failures"), pl.len().alias("items")
    )
    wrong = at_step.filter(~pl.col("correct").fill_null(False))
    if "top5" in wrong.columns:
        wrong = wrong.with_columns(pl.col("top5").map_elements(_fmt_top5, return_dtype=pl.Utf8).alias("top5"))
    else:
        wrong = wrong.with_columns(pl.lit(None, dtype=pl.Utf8).alias("top5"))
    wrong = (
        wrong.sort(
            ["task", "split", "gold_first_rank", "mode_ok"], descending=[False, False, True, False], nulls_last=True
        )
        .group_by("task", "split", maintain_order=True)
        .head(n)
    )
    return wrong.join(counts, on=["task", "split"], how="left").select(
        "task",
        "split",
        "stage",
        "step",
        "prompt",
        "gold",
        "pred",
        "mode_ok",
        "gold_first_rank",
        "top5",
        "failures",
        "items",
    )


def _fmt_top5(top5: Any) -> str:
    if top5 is None:
        return ""
    items = top5.to_list() if hasattr(top5, "to_list") else list(top5)
    return ", ".join(f"{t['token']!r} {t['prob']:.2f}" for t in items if t)


def readable_prompt(prompt: str | None) -> str:
    """A ChatML prompt as the conversation it encodes: the single user message as is, several turns as
    ``user: …`` lines; other text unchanged."""
    import re

    if not prompt or "<|im_start|>" not in prompt:
        return prompt or ""
    turns = re.findall(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|$)", prompt, flags=re.S)
    turns = [(role, text.strip()) for role, text in turns if text.strip()]
    if len(turns) == 1 and turns[0][0] == "user":
        return turns[0][1]
    return "\n".join(f"{role}: {text}" for role, text in turns)


def hijack_tasks(run_dir: PathLike) -> set[str]:
    """Tasks whose gold answers themselves start with a hijack word (yes/no tasks): a high ``ft_hijack`` is right
    for them, so a diagnosis should not flag it."""
    samples = load_samples(run_dir)
    words = {str(w).strip().lower() for w in (read_config(run_dir).get("eval", {}).get("hijack_words") or [])}
    if samples.is_empty() or "gold_first_token" not in samples.columns or not words:
        return set()
    first = samples.select(
        "task",
        pl.col("gold_first_token")
        .str.strip_chars()
        .str.to_lowercase()
        .str.strip_chars(".,!?")
        .is_in(list(words))
        .alias("h"),
    )
    share = first.group_by("task").agg(pl.col("h").mean())
    return set(share.filter(pl.col("h") >= 0.5)["task"].to_list())


def load_one(run: PathLike | pl.DataFrame) -> pl.DataFrame:
    """A frame for one run from a run directory (or a frame, returned as is)."""
    return run if isinstance(run, pl.DataFrame) else load_run(Path(run))


def final_against_baselines(frame: pl.DataFrame, metric: str, split: str) -> pl.DataFrame:
    """:func:`analysis.evidence.above_baseline` for the run's last evaluation of ``metric`` on ``split``."""
    rows = eval_rows(frame, [metric], split)
    if rows.is_empty():
        return pl.DataFrame()
    final = rows.filter(pl.col("step") == rows["step"].max()).unique("task", keep="last", maintain_order=True)
    base = baselines(frame).filter(pl.col("metric") == metric, pl.col("split") == split)
    return above_baseline(final.select("task", "value", "n", "ci_low", "ci_high"), base, ALPHA).sort("task")
