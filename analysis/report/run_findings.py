"""The findings of a run's report: what a reader should look at first, in sentences, every number read from the
data — each task's end value and the largest fall, scores against baselines, peaks lost, the seesaw events (counted
per family, as the console counts them), the first-token hijack, what one item weighs and empty answers, and
memorisation."""

from __future__ import annotations

from html import escape

import polars as pl

from analysis import frames as F
from analysis import plots as P
from analysis.loading import AnalysisError, load_samples
from analysis.report.evidence import baseline_findings
from analysis.report.page import fmt, fmt_rank
from analysis.report.run_data import RunData
from harness.core.seesaw import SEESAW_METRICS
from harness.core.seesaw_families import describe_counts, families_scope, family_label


def findings(run: RunData) -> list[str]:
    """The findings as markup sentences, most telling first."""
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
        for _gap, t, peak, at in sorted(lost, reverse=True)[:3]:
            what = "learned, then lost" if m == run.metric else "answered in the right form, then lost it"
            out.append(
                f"<b>{escape(t)}</b> {escape(m)} peaked at {fmt(peak)} (step {at}) and ended at {fmt(end[t])}: {what}."
            )
    return out


def events_test(run: RunData) -> str:
    """The rule behind ``run.events``: the run's own (its summary's ``seesaw``) when the events are the ones it
    stored at its δ; else ``none``, the untested rule they were recomputed with (:func:`analysis.seesaw_events`)."""
    rule = run.summary.get("seesaw") or {}
    stored = rule.get("test") == "paired" and abs(float(rule.get("delta", run.delta)) - run.delta) <= 1e-12
    return "paired" if stored else "none"


def seesaw_rule(run: RunData) -> str:
    """How the run's events were decided, in words (its summary's ``seesaw``; older runs: the untested rule)."""
    rule = run.summary.get("seesaw") or {}
    if events_test(run) == "paired":
        return (
            f"paired test: both changes significant on the fixed items — exact McNemar, Benjamini–Hochberg over "
            f"the run's {rule.get('tests')} tests at α = {rule.get('alpha'):g}"
        )
    return "untested threshold rule: movements, not findings"


def _seesaw_findings(run: RunData) -> list[str]:
    """The in-run seesaw events (or their absence), then the same definition on mode_ok when it fired."""
    events, mode_events, delta = run.events, run.mode_events, run.delta
    scope = escape(families_scope(events_test(run)))
    if events.is_empty():
        out = [
            f"No seesaw events at δ = {delta:g} ({scope}: no evaluation where one rose by δ while the other fell "
            f"by δ; {escape(seesaw_rule(run))})."
        ]
    else:
        parts = []
        for (m, sp, a, b), block in events.group_by("metric", "split", "step_from", "step_to", maintain_order=True):
            rose = ", ".join(dict.fromkeys(block["rose"].to_list()))
            fell = ", ".join(dict.fromkeys(block["fell"].to_list()))
            p = block["p_value"].drop_nulls()
            where = f"{escape(m)} on {escape(sp)}" if m in SEESAW_METRICS else escape(family_label(m))
            parts.append(
                f"{where}, step {a} → {b}: ↑ {escape(rose)} ↓ {escape(fell)}"
                + (f" (p ≤ {p.max():.2g})" if p.len() else "")
            )
        shown = "; ".join(parts[:4]) + (f"; and {len(parts) - 4} more" if len(parts) > 4 else "")
        out = [
            f"<b>{events.height} seesaw event{'s' if events.height > 1 else ''}</b> at δ = {delta:g}: "
            f"{escape(describe_counts(events.iter_rows(named=True)))} ({scope}; {escape(seesaw_rule(run))}): "
            f"{shown}."
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
