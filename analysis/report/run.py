"""The report of one run: findings in words, the curriculum and its effective mixture, stage-end tables, per-task
curves with stage boundaries and seesaw events, the first-token hijack, the seesaw events, the worst failures per
task, training curves and the resolved config."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Optional

import polars as pl

from analysis import frames as F
from analysis import plots as P
from analysis.loading import AnalysisError, PathLike, load_run, load_samples, read_config, read_summary
from analysis.report.choice import choice_and_benchmark_curves
from analysis.report.evidence import baseline_findings, baseline_section, data_notes, interval_note, stage_end_intervals
from analysis.report.page import Page, facts_table, fmt, fmt_rank, table

# The stage-end tables shown folded under the main metric's (each when the run logged it).
OTHER_STAGE_METRICS = ("mode_ok", "tf_first", "ft_hijack", "ft_rank_median")


@dataclass
class RunData:
    """One run as every section of its report reads it, loaded once."""

    run_dir: Path
    frame: pl.DataFrame
    config: dict
    summary: dict
    metric: str
    delta: float
    splits: list[str]
    primary: str  # the split findings and folded tables read: heldout when evaluated
    tasks: list[str]
    colors: dict[str, str]
    events: pl.DataFrame
    mode_events: pl.DataFrame
    expected: set[str]  # tasks whose gold answers start with a hijack word
    bounds: pl.DataFrame
    name: str
    run_id: str


def load_run_data(run_dir: Path, metric: str, delta: Optional[float]) -> RunData:
    """Read the run's store, config and summary; ``delta`` defaults to the config's ``eval.seesaw_delta``."""
    frame = load_run(run_dir)
    if frame.is_empty():
        raise AnalysisError(f"{run_dir}: the store is empty (the run has not evaluated yet)")
    config = read_config(run_dir)
    summary = read_summary(run_dir)
    delta = float(delta if delta is not None else (config.get("eval") or {}).get("seesaw_delta", 0.15))
    evals = F.eval_rows(frame)
    splits = list(
        dict.fromkeys(s for s in (config.get("eval") or {}).get("splits", []) if s in evals["split"].unique().to_list())
    ) or sorted(evals["split"].unique().to_list())
    tasks = sorted(evals["task"].unique().to_list())
    # The in-run definition reads greedy and ft_hijack; the same definition on mode_ok shows a seesaw in the answers'
    # *form* (yes/no vs open answers) that exact match at 0 would hide.
    return RunData(
        run_dir=run_dir,
        frame=frame,
        config=config,
        summary=summary,
        metric=metric,
        delta=delta,
        splits=splits,
        primary="heldout" if "heldout" in splits else splits[0],
        tasks=tasks,
        colors=P.task_colors(tasks),
        events=F.seesaw_events(frame, delta),
        mode_events=F.seesaw_events(frame, delta, metrics=["mode_ok"]),
        expected=F.hijack_tasks(run_dir),
        bounds=F.stage_bounds(frame),
        name=config.get("name") or summary.get("experiment") or run_dir.name,
        run_id=frame["run_id"][0],
    )


# ----------------------------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------------------------


def _heat(value: Optional[float], low_good: bool) -> str:
    """A background for a value in [0, 1]: white at 0 to green at 1 (to red for metrics where lower is better)."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or not 0 <= value <= 1:
        return ""
    if low_good:
        r, g, b = 255, int(255 - 95 * value), int(255 - 95 * value)
    else:
        r, g, b = int(255 - 110 * value), int(255 - 45 * value), int(255 - 110 * value)
    return f"background:rgb({r},{g},{b})"


def stage_table_html(table_frame: pl.DataFrame, metric: str, delta: float, intervals: Optional[dict] = None) -> str:
    """The stage table with every cell shaded by value and the change from the previous stage (a fall of at least
    δ in red); ``intervals`` (``{(stage, task): (low, high)}``) prints each proportion's 95 % interval under it."""
    tasks = [c for c in table_frame.columns if c not in ("run_id", "stage", "step")]
    low_good = F.lower_is_better(metric)
    rank = metric.startswith("ft_rank")
    head = "<th>stage</th><th>end step</th>" + "".join(f"<th>{escape(t)}</th>" for t in tasks)
    rows = []
    previous: dict[str, Optional[float]] = {}
    for r in table_frame.iter_rows(named=True):
        tds = [f"<td>{escape(r['stage'])}</td>", f"<td class='num'>{r['step']}</td>"]
        for t in tasks:
            v = r[t]
            note = ""
            if v is not None and previous.get(t) is not None:
                d = v - previous[t]
                worse = d > 0 if low_good else d < 0
                if abs(d) > 1e-12:
                    cls = "down" if worse and abs(d) >= delta - 1e-9 else ("up" if not worse else "")
                    note = f"<span class='d {cls}'>{f'{d:+,.0f}' if rank else f'{d:+.3f}'}</span>"
            tds.append(
                f"<td class='num' style='{_heat(v, low_good) if 'loss' not in metric else ''}'>"
                f"{fmt_rank(v) if rank else fmt(v)}{note}{interval_note(intervals, r['stage'], t)}</td>"
            )
            previous[t] = v
        rows.append("<tr>" + "".join(tds) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _written_mixture(mixture: object) -> str:
    """A stage's mixture as the config wrote it, in words."""
    if isinstance(mixture, dict) and "weights" in mixture:
        return ", ".join(f"{t} {w:g}" for t, w in mixture["weights"].items())
    if isinstance(mixture, dict) and "natural" in mixture:
        return "natural (pool sizes)"
    if isinstance(mixture, dict) and "adaptive" in mixture:
        return f"adaptive: {mixture['adaptive'].get('method')} over {', '.join(mixture['adaptive'].get('tasks', []))}"
    if isinstance(mixture, dict) and "counts" in mixture:
        return "counts " + ", ".join(f"{t} {n}" for t, n in mixture["counts"].items())
    return json.dumps(mixture) if mixture else "–"


def _stage_rows(config: dict, summary: dict, bounds: pl.DataFrame, frame: pl.DataFrame) -> pl.DataFrame:
    """The curriculum: one row per stage with its steps, init, mixture as written, effective shares and lr."""
    stages = config.get("stages") or []
    by_name = {s.get("name"): s for s in stages}
    comp = {s["name"]: s.get("composition", {}) for s in summary.get("stages", [])}
    mix = frame.filter(pl.col("metric") == "mix_share")
    rows = []
    for r in bounds.sort("index").iter_rows(named=True):
        spec = by_name.get(r["stage"], {})
        shares = {t: c.get("share") for t, c in comp.get(r["stage"], {}).items()}
        if not shares:
            shares = {x["task"]: x["value"] for x in mix.filter(pl.col("stage") == r["stage"]).iter_rows(named=True)}
        effective = ", ".join(f"{t} {s:.0%}" for t, s in sorted(shares.items(), key=lambda kv: -kv[1]) if s)
        rows.append(
            {
                "stage": r["stage"],
                "steps": f"{r['start']} → {r['end']}",
                "init": spec.get("init", "–"),
                "mixture (as written)": _written_mixture(spec.get("mixture", {})),
                "effective mixture": effective or "–",
                "lr": (spec.get("optim") or {}).get("lr"),
                "batch": spec.get("batch_size"),
            }
        )
    return pl.DataFrame(rows)


# ----------------------------------------------------------------------------------------------------------------
# Findings: what a reader should look at first, in sentences (every number read from the data)
# ----------------------------------------------------------------------------------------------------------------


def _findings(run: RunData) -> list[str]:
    try:
        st = F.stage_table(run.frame, run.metric, run.primary)
    except AnalysisError:
        return [f"no {escape(run.metric)} rows yet"]
    tasks = [c for c in st.columns if c not in ("run_id", "stage", "step")]
    last = st.row(-1, named=True)
    return [
        *_end_and_largest_fall(run, st, tasks, last),
        *baseline_findings(run.frame, run.metric, run.primary, P.SPLIT_TITLES.get(run.primary, run.primary)),
        *_lost_peaks(run),
        *_seesaw_findings(run),
        *_hijack_findings(run),
        *_sample_findings(run),
        *_memorisation_findings(run, tasks, last),
    ]


def _end_and_largest_fall(run: RunData, st: pl.DataFrame, tasks: list[str], last: dict) -> list[str]:
    """Every task's value at the end, and the largest fall between consecutive stage ends."""
    ranked = sorted(((last[t], t) for t in tasks if last[t] is not None), reverse=True)
    out = [
        f"At the end (step {last['step']}, stage <b>{escape(last['stage'])}</b>), {escape(run.metric)} on "
        f"{escape(P.SPLIT_TITLES.get(run.primary, run.primary))}: "
        + ", ".join(f"{escape(t)} <b>{fmt(v)}</b>" for v, t in ranked)
        + "."
    ]
    drops = []
    for a, b in zip(st.iter_rows(named=True), list(st.iter_rows(named=True))[1:]):
        for t in tasks:
            if a[t] is not None and b[t] is not None and a[t] - b[t] > 1e-9:
                drops.append((a[t] - b[t], t, a["stage"], b["stage"], a[t], b[t]))
    if drops:
        d, t, s1, s2, v1, v2 = max(drops)
        out.append(
            f"Largest stage-to-stage fall: <b>{escape(t)}</b> {fmt(v1)} → {fmt(v2)} from the end of "
            f"{escape(s1)} to the end of {escape(s2)}."
        )
    return out


def _lost_peaks(run: RunData) -> list[str]:
    """Tasks whose metric (and answer form, mode_ok) peaked at least δ above where they ended."""
    out = []
    for m in dict.fromkeys([run.metric, "mode_ok"]):
        rows = F.eval_rows(run.frame, [m], run.primary)
        if rows.is_empty():
            continue
        final = rows.filter(pl.col("step") == rows["step"].max()).unique("task", keep="last")
        end = dict(zip(final["task"].to_list(), final["value"].to_list()))
        # Peaks after training started (the base model's babble is often "in form": not a thing learned).
        peaks = (
            rows.filter(pl.col("step") > rows["step"].min())
            .group_by("task")
            .agg(pl.col("value").max().alias("peak"), pl.col("step").sort_by("value").last().alias("at"))
        )
        lost = [
            (r["peak"] - end[r["task"]], r["task"], r["peak"], r["at"])
            for r in peaks.iter_rows(named=True)
            if end.get(r["task"]) is not None and r["peak"] - end[r["task"]] >= run.delta - 1e-9
        ]
        for gap, t, peak, at in sorted(lost, reverse=True)[:3]:
            what = "learned, then lost" if m == run.metric else "answered in the right form, then lost it"
            out.append(
                f"<b>{escape(t)}</b> {escape(m)} peaked at {fmt(peak)} (step {at}) and ended at {fmt(end[t])}: {what}."
            )
    return out


def _seesaw_rule(run: RunData) -> str:
    """How the run's events were decided, in words (its summary's ``seesaw``; older runs: the untested rule)."""
    rule = run.summary.get("seesaw") or {}
    if rule.get("test") == "paired":
        return (
            f"paired test: both changes significant on the fixed items — exact McNemar, Benjamini–Hochberg over "
            f"the run's {rule.get('tests')} tests at α = {rule.get('alpha'):g}"
        )
    return "untested threshold rule: movements, not findings"


def _seesaw_findings(run: RunData) -> list[str]:
    """The in-run seesaw events (or their absence), then the same definition on mode_ok when it fired."""
    events, mode_events, delta = run.events, run.mode_events, run.delta
    if events.is_empty():
        out = [
            f"No seesaw events at δ = {delta:g} (no evaluation where one task rose by δ while another fell "
            f"by δ; {escape(_seesaw_rule(run))})."
        ]
    else:
        parts = []
        for (m, sp, a, b), block in events.group_by("metric", "split", "step_from", "step_to", maintain_order=True):
            rose = ", ".join(dict.fromkeys(block["rose"].to_list()))
            fell = ", ".join(dict.fromkeys(block["fell"].to_list()))
            p = block["p_value"].drop_nulls()
            parts.append(
                f"{escape(m)} on {escape(sp)}, step {a} → {b}: ↑ {escape(rose)} ↓ {escape(fell)}"
                + (f" (p ≤ {p.max():.2g})" if p.len() else "")
            )
        shown = "; ".join(parts[:4]) + (f"; and {len(parts) - 4} more" if len(parts) > 4 else "")
        out = [
            f"<b>{events.height} seesaw event{'s' if events.height > 1 else ''}</b> at δ = {delta:g} "
            f"({escape(_seesaw_rule(run))}): {shown}."
        ]
    if not mode_events.is_empty():
        parts = [
            f"step {r['step_from']} → {r['step_to']} on {escape(r['split'])}: ↑ {escape(r['rose'])} "
            f"+{r['rose_by']:.2f} ↓ {escape(r['fell'])} −{r['fell_by']:.2f}"
            for r in mode_events.iter_rows(named=True)
        ][:4]
        out.append(
            f"The seesaw in answer <b>form</b> (mode_ok, outside the in-run definition; untested rule): "
            f"{mode_events.height} event{'s' if mode_events.height > 1 else ''} — "
            + "; ".join(parts)
            + ("; …" if mode_events.height > 4 else "")
            + "."
        )
    return out


def _hijack_findings(run: RunData) -> list[str]:
    """The first-token hijack at the end, of tasks whose answers do not start with a hijack word."""
    try:
        tl = F.hijack_timeline(run.frame)
    except AnalysisError:
        return []
    out = []
    if not tl.is_empty():
        end = tl.filter(pl.col("step") == tl["step"].max())
        for (sp,), block in end.group_by("split", maintain_order=True):
            hit = [
                r
                for r in block.sort("ft_hijack", descending=True, nulls_last=True).iter_rows(named=True)
                if r["task"] not in run.expected and r["ft_hijack"] is not None and r["ft_hijack"] >= 0.5
            ]
            if hit:
                out.append(
                    f"<b>First-token hijack</b> at the end on {escape(P.SPLIT_TITLES.get(sp, sp))} (share of "
                    "prompts whose most likely first token is a hijack word): "
                    + "; ".join(
                        f"{escape(r['task'])} <b>{r['ft_hijack']:.0%}</b> (most common top-1 "
                        f"{escape(repr(r['top1']))}; the gold first token ranks "
                        f"{fmt_rank(r['ft_rank_median'])})"
                        for r in hit
                    )
                    + "."
                )
    return out


def _sample_findings(run: RunData) -> list[str]:
    """From the final evaluation's samples: how far one item moves a score, and tasks that answer with nothing
    (the model ends its turn at once)."""
    try:
        samples = load_samples(run.run_dir)
    except Exception:  # noqa: BLE001 - a report still renders without samples
        samples = pl.DataFrame()
    if samples.is_empty() or "pred" not in samples.columns:
        return []
    out = []
    final = samples.filter(pl.col("step") == samples["step"].max(), pl.col("split") == run.primary)
    final = final.filter(pl.col("stage") == final["stage"][-1]) if final.height else final
    sizes = final.group_by("task").len().sort("task")
    if sizes.height:
        n_min, n_max = sizes["len"].min(), sizes["len"].max()
        size = f"{n_min}" if n_min == n_max else f"{n_min}–{n_max}"
        out.append(
            f"<span class='note'>Evaluation sets: {size} items per task on {escape(run.primary)}, so one "
            f"item moves a score by {1 / n_max:.3f}"
            + (f"–{1 / n_min:.3f}" if n_min != n_max else "")
            + f" (δ = {run.delta:g}).</span>"
        )
    empty = (
        final.group_by("task")
        .agg((pl.col("pred").fill_null("").str.strip_chars() == "").mean().alias("e"))
        .filter(pl.col("e") >= 0.25)
        .sort("e", descending=True)
    )
    if not empty.is_empty():
        out.append(
            "<b>Empty answers</b> at the end (the model ends its turn at once): "
            + ", ".join(f"{escape(r['task'])} {r['e']:.0%}" for r in empty.iter_rows(named=True))
            + "."
        )
    return out


def _memorisation_findings(run: RunData, tasks: list[str], last: dict) -> list[str]:
    """Tasks far better on their training items than held out (when the train split was evaluated)."""
    if "train" not in run.splits or run.primary == "train":
        return []
    out = []
    try:
        tr = F.stage_table(run.frame, run.metric, "train").row(-1, named=True)
        gaps = [(tr[t] - last[t], t) for t in tasks if tr.get(t) is not None and last[t] is not None]
        for gap, t in sorted(gaps, reverse=True)[:3]:
            if gap >= 0.25:
                out.append(
                    f"<b>{escape(t)}</b>: {fmt(tr[t])} on training items vs {fmt(last[t])} held out — "
                    "memorised rather than learned."
                )
    except AnalysisError:
        pass
    return out


# ----------------------------------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------------------------------


def _summary_sections(page: Page, run: RunData) -> None:
    """Findings, the curriculum and the stage-end tables."""
    page.section("Findings", "findings")
    page.findings(_findings(run))
    if not run.summary:
        page.p("The run has not finished (no summary.json): this report shows what the store holds so far.", "note")
    for note in data_notes(run.summary):
        page.p(escape(note), "note")

    page.section("Curriculum", "curriculum")
    page.raw(table(_stage_rows(run.config, run.summary, run.bounds, run.frame)))
    page.figure(
        lambda: P.plot_composition(run.frame, run.colors),
        "composition.png",
        "Effective mixture per stage: the share of training examples of each task actually drawn.",
    )

    metric, delta, primary = run.metric, run.delta, run.primary
    page.section("Stage-end table", "stage-table")
    page.p(
        f"{escape(metric)} at the last evaluation of each stage (the seed's comparison table). The small number "
        f"is the change from the previous stage's end; <span class='down'>red</span>: a fall of at least "
        f"δ = {delta:g}."
    )
    for split in run.splits:
        page.h3(f"{metric} · {P.SPLIT_TITLES.get(split, split)} ({split})")
        page.raw(
            stage_table_html(
                F.stage_table(run.frame, metric, split), metric, delta, stage_end_intervals(run.frame, metric, split)
            )
        )
    baseline_section(page, run.frame, metric, primary)
    others = [m for m in OTHER_STAGE_METRICS if m != metric and not F.eval_rows(run.frame, [m], primary).is_empty()]
    if others:
        inner = "".join(
            f"<h3>{escape(m)} · {escape(primary)}</h3>"
            + stage_table_html(
                F.stage_table(run.frame, m, primary),
                m,
                delta if m != "ft_rank_median" else 1e9,
                stage_end_intervals(run.frame, m, primary),
            )
            for m in others
        )
        page.raw(f"<details><summary>{', '.join(others)} at stage ends ({escape(primary)})</summary>{inner}</details>")


def _curve_sections(page: Page, run: RunData) -> None:
    """Per-task curves of the metric, the answers' form and the loss; then the first-token probe."""
    frame, metric, splits, tasks, colors, delta = run.frame, run.metric, run.splits, run.tasks, run.colors, run.delta
    page.section("Curves", "curves")
    page.figure(
        lambda: P.plot_curves(frame, metric, splits, run.events, tasks, colors),
        f"curves_{metric}.png",
        f"Per-task {escape(metric)} at every evaluation across the curriculum; grey bands are stages. "
        f"▲/▼: a seesaw event (one task rose by ≥ {delta:g} while another fell by ≥ {delta:g}).",
    )
    if not frame.filter(pl.col("metric") == "mixture_weight").is_empty():  # an adaptive stage steered the mixture
        page.figure(
            lambda: P.plot_mixture_weights(frame, colors),
            "mixture_weights.png",
            "Adaptive mixture: each task's sampling weight as the controller moved it (docs/steering.md), "
            "on the same steps as the curves above.",
        )
    loss_metric = "eval_loss" if not F.eval_rows(frame, ["eval_loss"], splits).is_empty() else "loss"
    for m, caption in (
        (
            "mode_ok",
            "Share of greedy answers in the task's form (yes/no answers start with yes/no, "
            "open answers must not…): a format collapse shows here before accuracy.",
        ),
        (loss_metric, "Answer-token loss per task on the evaluation items (teacher forced)."),
    ):
        if m != metric and not F.eval_rows(frame, [m], splits).is_empty():
            page.figure(
                lambda m=m: P.plot_curves(frame, m, splits, pl.concat([run.events, run.mode_events]), tasks, colors),
                f"curves_{m}.png",
                caption,
            )

    choice_and_benchmark_curves(page, run)

    page.section("First token", "first-token")
    hijack_words = (run.config.get("eval") or {}).get("hijack_words") or ["yes", "no"]
    page.figure(
        lambda: P.plot_hijack(frame, splits, colors, run.expected, run.events),
        "first_token.png",
        "Top: share of prompts whose most likely first answer token is a hijack word "
        f"({escape(', '.join(map(str, hijack_words)))}). "
        "Bottom: median rank of the gold first token among the whole vocabulary (1 = top; up is better). "
        + ("Dashed: tasks whose answers do start with yes/no." if run.expected else ""),
    )
    top = F.top1_table(frame, run.primary)
    if not top.is_empty():
        page.h3(f"Most common top-1 first tokens at each stage end ({run.primary})")
        wide = top.pivot(on="stage", index="task", values="tokens", aggregate_function="first")
        page.raw(table(wide))


def _event_and_failure_sections(page: Page, run: RunData, failures: int) -> None:
    """The seesaw events as tables, then the worst failures per task at the final evaluation."""
    page.section("Seesaw events", "events")
    page.p(
        f"Between consecutive evaluations, one task rose by at least δ = {run.delta:g} while another fell by at "
        f"least δ (the in-run definition, {escape(_seesaw_rule(run))}; metrics greedy and ft_hijack — for "
        "ft_hijack a rise is bad). p_value: the larger of the two changes' adjusted p-values."
    )
    page.raw(table(run.events.drop("run_id")))
    if not run.mode_events.is_empty():
        page.h3("The untested threshold rule on mode_ok (the answer's form; not part of the in-run events)")
        page.raw(table(run.mode_events.drop("run_id")))

    page.section("Worst failures", "failures")
    page.p(
        f"At the final evaluation: up to {failures} wrong answers per task and split, the most confidently wrong "
        "first (gold first token ranked lowest)."
    )
    worst = F.worst_failures(run.run_dir, failures)
    if worst.is_empty():
        page.p("(no samples.jsonl, or no failures)", "note")
        return
    for (task,), block in worst.group_by("task", maintain_order=True):
        counts = block.select("split", "failures", "items").unique(maintain_order=True)
        rate = ", ".join(f"{r['split']}: {r['failures']}/{r['items']} wrong" for r in counts.iter_rows(named=True))
        page.h3(f"{task} — {rate}")
        shown = block.select(
            "split",
            pl.col("prompt").map_elements(F.readable_prompt, return_dtype=pl.Utf8),
            "gold",
            "pred",
            "mode_ok",
            pl.col("gold_first_rank").alias("gold rank"),
            pl.col("top5").alias("top-5 first tokens"),
        )
        page.raw(
            table(
                shown,
                wrap=("prompt", "gold", "pred", "top-5 first tokens"),
                cell=lambda c, v, r: "<i>(empty)</i>" if c == "pred" and not (v or "").strip() else None,
            )
        )


def _run_facts(run: RunData, out: Path, started: float) -> dict[str, str]:
    """Where the run is, its base model and timing, and the command that wrote this report (with its time)."""
    facts = {"run id": run.run_id, "run directory": str(run.run_dir.resolve()), "experiment": run.name}
    base = run.summary.get("base") or {}
    if base:
        facts["base model"] = f"{base.get('source')} (cache {'hit' if base.get('cache_hit') else 'miss'})"
    timing = run.summary.get("timing") or {}
    if timing:
        facts["time"] = f"{timing.get('total_s', 0):.1f}s in all, evaluation {100 * timing.get('eval_share', 0):.0f}%"
    facts["report"] = f"harness report {run.run_dir} --out {out} ({time.perf_counter() - started:.1f}s)"
    return {k: str(v) for k, v in facts.items()}


def run_report(
    run_dir: PathLike,
    out: Optional[PathLike] = None,
    *,
    metric: str = "greedy",
    delta: Optional[float] = None,
    failures: int = 3,
) -> Path:
    """Write ``report.html`` and its PNGs for one run into ``out`` (default ``RUN_DIR/report``); returns the HTML
    path."""
    started = time.perf_counter()
    run_dir = Path(run_dir)
    out = Path(out) if out is not None else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    run = load_run_data(run_dir, metric, delta)

    page = Page(out, f"{run.name} — run report")
    _summary_sections(page, run)
    _curve_sections(page, run)
    _event_and_failure_sections(page, run, failures)

    page.section("Training", "training")
    page.figure(
        lambda: P.plot_training(run.frame, run.colors),
        "training.png",
        "Training loss (overall in black, per task in colour), learning rate, gradient norm and update ratio.",
    )

    page.section("Run", "run")
    page.raw(facts_table(_run_facts(run, out, started)))
    page.file_details(run_dir / "config.resolved.yaml")
    subtitle = (
        f"run <code>{escape(run.run_id)}</code> · {len(run.bounds)} stages · {run.bounds['end'].max()} "
        f"steps · {len(run.tasks)} tasks · splits {escape(', '.join(run.splits))} · "
        f"seesaw δ = {run.delta:g}"
    )
    return page.write(subtitle)
