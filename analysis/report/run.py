"""The report of one run: findings in words, the curriculum and its effective mixture, stage-end tables, per-task
curves with stage boundaries and seesaw events, the first-token hijack, the seesaw events, the worst failures per
task, training curves and the resolved config."""

from __future__ import annotations

import json
import math
import time
from html import escape
from pathlib import Path

import polars as pl

from analysis import frames as F
from analysis import plots as P
from analysis.loading import PathLike
from analysis.report.choice import choice_and_benchmark_curves
from analysis.report.evidence import baseline_section, data_notes, interval_note, stage_end_intervals
from analysis.report.page import Page, facts_table, fmt, fmt_rank, table
from analysis.report.run_data import RunData, load_run_data
from analysis.report.run_findings import events_test, findings, seesaw_rule
from harness.core.seesaw_families import families_scope, family_label

# The stage-end tables shown folded under the main metric's (each when the run logged it).
OTHER_STAGE_METRICS = ("mode_ok", "tf_first", "ft_hijack", "ft_rank_median")


# ----------------------------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------------------------


def _heat(value: float | None, low_good: bool) -> str:
    """A background for a value in [0, 1]: white at 0 to green at 1 (to red for metrics where lower is better)."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or not 0 <= value <= 1:
        return ""
    if low_good:
        r, g, b = 255, int(255 - 95 * value), int(255 - 95 * value)
    else:
        r, g, b = int(255 - 110 * value), int(255 - 45 * value), int(255 - 110 * value)
    return f"background:rgb({r},{g},{b})"


def stage_table_html(table_frame: pl.DataFrame, metric: str, delta: float, intervals: dict | None = None) -> str:
    """The stage table with every cell shaded by value and the change from the previous stage (a fall of at least
    δ in red); ``intervals`` (``{(stage, task): (low, high)}``) prints each proportion's 95 % interval under it."""
    tasks = [c for c in table_frame.columns if c not in ("run_id", "stage", "step")]
    low_good = F.lower_is_better(metric)
    rank = metric.startswith("ft_rank")
    head = "<th>stage</th><th>end step</th>" + "".join(f"<th>{escape(t)}</th>" for t in tasks)
    rows = []
    previous: dict[str, float | None] = {}
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
# Sections
# ----------------------------------------------------------------------------------------------------------------


def _summary_sections(page: Page, run: RunData) -> None:
    """Findings, the curriculum and the stage-end tables."""
    page.section("Findings", "findings")
    page.findings(findings(run))
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
        f"▲/▼: a task–task seesaw event (one task rose by ≥ {delta:g} while another fell by ≥ {delta:g}); "
        "the events against benchmarks and the reference text are listed under Seesaw events.",
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
        f"least δ (the in-run definition, {escape(seesaw_rule(run))}; "
        f"{escape(families_scope(events_test(run)))} — task–task on greedy and ft_hijack, for ft_hijack a rise is "
        "bad; against a benchmark or the forgetting probe's reference text, the task's greedy score against the "
        "benchmark's accuracy or the text's per-document log-likelihood). The events the run's console and "
        "summary.json list. p_value: the larger of the two changes' adjusted p-values."
    )
    families = pl.Series("family", [family_label(m) for m in run.events["metric"].to_list()], dtype=pl.Utf8)
    page.raw(table(run.events.drop("run_id").insert_column(0, families)))
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
    out: PathLike | None = None,
    *,
    metric: str = "greedy",
    delta: float | None = None,
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
