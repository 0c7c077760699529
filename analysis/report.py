"""``harness report``: one self-contained HTML page (PNGs embedded, and written next to it) for a run or a sweep.

Run report: findings in words, the curriculum and its effective mixture, stage-end tables, per-task curves with
stage boundaries and seesaw events, the first-token hijack, the seesaw events, the worst failures per task,
training curves and the resolved config. Sweep report: findings, best trials, optimisation history, the
interference matrix with its fit quality and the predicted best mixture, weight → metric partial dependence,
the Pareto front, failed / pruned trials and the best trial's curves.
"""

from __future__ import annotations

import base64
import html
import json
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import polars as pl

from analysis import frames as F
from analysis import plots as P
from analysis import sweep as S
from analysis.io import (
    AnalysisError,
    PathLike,
    is_run_dir,
    is_sweep_dir,
    load_run,
    load_sweep,
    read_config,
    read_summary,
    read_sweep_config,
)

REPORT_FILE = "report.html"

CSS = """
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#222;
     max-width:1180px;margin:24px auto;padding:0 20px;line-height:1.45;font-size:14px}
h1{font-size:22px;margin-bottom:2px} h2{font-size:18px;margin-top:34px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px} .sub{color:#666;margin-top:0} code,pre{font-family:Menlo,Consolas,monospace;font-size:12px}
pre{background:#f7f7f7;padding:10px;overflow-x:auto;border-radius:4px}
table{border-collapse:collapse;margin:8px 0 14px;font-size:12.5px} th,td{padding:3px 9px;border-bottom:1px solid #e6e6e6;
     text-align:left;vertical-align:top} th{background:#fafafa;font-weight:600} td.num{text-align:right;font-variant-numeric:tabular-nums}
td.wrap{max-width:340px;white-space:pre-wrap;word-break:break-word} .d{font-size:10.5px;color:#666;margin-left:4px}
.down{color:#c62828;font-weight:600} .up{color:#2e7d32} figure{margin:10px 0 22px} figure img{max-width:100%}
figcaption{color:#555;font-size:12.5px;margin-top:4px} .findings li{margin:3px 0} .note{color:#666;font-size:12.5px}
nav{background:#fafafa;border:1px solid #eee;padding:6px 12px;border-radius:4px;font-size:13px}
nav a{margin-right:12px;color:#1565c0;text-decoration:none} details summary{cursor:pointer;color:#1565c0;margin:6px 0}
.ok{color:#2e7d32}.bad{color:#c62828}
"""


class Page:
    """An HTML page under construction; figures are saved as PNG files in ``out`` and embedded as base64."""

    def __init__(self, out: Path, title: str):
        self.out = out
        self.title = title
        self.body: list[str] = []
        self.toc: list[tuple[str, str]] = []
        self.pngs: list[Path] = []

    def section(self, title: str, anchor: str) -> None:
        self.toc.append((anchor, title))
        self.body.append(f'<h2 id="{anchor}">{html.escape(title)}</h2>')

    def h3(self, title: str) -> None:
        self.body.append(f"<h3>{html.escape(title)}</h3>")

    def p(self, text: str, cls: Optional[str] = None) -> None:
        self.body.append(f"<p{f' class={cls!r}' if cls else ''}>{text}</p>")

    def raw(self, markup: str) -> None:
        self.body.append(markup)

    def figure(self, make: Callable[[], Any], name: str, caption: str) -> None:
        """Draw with ``make()`` (a Figure), save ``name`` and embed it; a figure that cannot be drawn (no data)
        becomes a note instead."""
        try:
            fig = make()
        except AnalysisError as e:
            self.p(f"({html.escape(name)} not drawn: {html.escape(str(e))})", "note")
            return
        path = P.save(fig, self.out / name)
        self.pngs.append(path)
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        self.body.append(f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(name)}">'
                         f'<figcaption>{caption} <a href="{html.escape(name)}">{html.escape(name)}</a>'
                         "</figcaption></figure>")

    def render(self, subtitle: str) -> str:
        nav = " ".join(f'<a href="#{a}">{html.escape(t)}</a>' for a, t in self.toc)
        return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
                f"<title>{html.escape(self.title)}</title><style>{CSS}</style></head><body>"
                f"<h1>{html.escape(self.title)}</h1><p class='sub'>{subtitle}</p><nav>{nav}</nav>"
                + "\n".join(self.body) + "</body></html>")

    def write(self, subtitle: str) -> Path:
        path = self.out / REPORT_FILE
        path.write_text(self.render(subtitle), encoding="utf-8")
        return path


# ----------------------------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------------------------


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "✓" if value else "✗"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if value != 0 and abs(value) < 10 ** -digits:
            return f"{value:.1e}"
        return f"{value:.{digits}f}"
    return html.escape(str(value))


def table(frame: pl.DataFrame, *, wrap: Sequence[str] = (), cell: Optional[Callable[[str, Any, dict], str]] = None,
          digits: int = 3) -> str:
    """A frame as an HTML table (``cell(column, value, row)`` may return the markup of a cell's content)."""
    if frame.is_empty():
        return "<p class='note'>(none)</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in frame.columns)
    rows = []
    for r in frame.iter_rows(named=True):
        tds = []
        for c, v in r.items():
            content = cell(c, v, r) if cell else None
            cls = "num" if isinstance(v, (int, float)) and not isinstance(v, bool) else ("wrap" if c in wrap else "")
            tds.append(f"<td class='{cls}'>{content if content is not None else fmt(v, digits)}</td>")
        rows.append("<tr>" + "".join(tds) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _heat(value: Optional[float], low_good: bool) -> str:
    """A background for a value in [0, 1]: white at 0 to green at 1 (to red for metrics where lower is better)."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or not 0 <= value <= 1:
        return ""
    if low_good:
        r, g, b = 255, int(255 - 95 * value), int(255 - 95 * value)
    else:
        r, g, b = int(255 - 110 * value), int(255 - 45 * value), int(255 - 110 * value)
    return f"background:rgb({r},{g},{b})"


def fmt_rank(value: Optional[float]) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.0f}" if abs(value - round(value)) < 1e-9 else f"{value:,.1f}"


def stage_table_html(table_frame: pl.DataFrame, metric: str, delta: float) -> str:
    """The stage table with every cell shaded by value and the change from the previous stage (a fall of at least
    δ in red)."""
    tasks = [c for c in table_frame.columns if c not in ("run_id", "stage", "step")]
    low_good = F.lower_is_better(metric)
    rank = metric.startswith("ft_rank")
    head = "<th>stage</th><th>end step</th>" + "".join(f"<th>{html.escape(t)}</th>" for t in tasks)
    rows = []
    previous: dict[str, Optional[float]] = {}
    for r in table_frame.iter_rows(named=True):
        tds = [f"<td>{html.escape(r['stage'])}</td>", f"<td class='num'>{r['step']}</td>"]
        for t in tasks:
            v = r[t]
            note = ""
            if v is not None and previous.get(t) is not None:
                d = v - previous[t]
                worse = d > 0 if low_good else d < 0
                if abs(d) > 1e-12:
                    cls = "down" if worse and abs(d) >= delta - 1e-9 else ("up" if not worse else "")
                    note = f"<span class='d {cls}'>{f'{d:+,.0f}' if rank else f'{d:+.3f}'}</span>"
            tds.append(f"<td class='num' style='{_heat(v, low_good) if 'loss' not in metric else ''}'>"
                       f"{fmt_rank(v) if rank else fmt(v)}{note}</td>")
            previous[t] = v
        rows.append("<tr>" + "".join(tds) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


# ----------------------------------------------------------------------------------------------------------------
# Run report
# ----------------------------------------------------------------------------------------------------------------


def _stage_rows(config: dict, summary: dict, bounds: pl.DataFrame, frame: pl.DataFrame) -> pl.DataFrame:
    """The curriculum: one row per stage with its steps, init, mixture as written, effective shares and lr."""
    stages = config.get("stages") or []
    by_name = {s.get("name"): s for s in stages}
    comp = {s["name"]: s.get("composition", {}) for s in summary.get("stages", [])}
    mix = frame.filter(pl.col("metric") == "mix_share")
    rows = []
    for r in bounds.sort("index").iter_rows(named=True):
        spec = by_name.get(r["stage"], {})
        mixture = spec.get("mixture", {})
        if isinstance(mixture, dict) and "weights" in mixture:
            written = ", ".join(f"{t} {w:g}" for t, w in mixture["weights"].items())
        elif isinstance(mixture, dict) and "natural" in mixture:
            written = "natural (pool sizes)"
        elif isinstance(mixture, dict) and "counts" in mixture:
            written = "counts " + ", ".join(f"{t} {n}" for t, n in mixture["counts"].items())
        else:
            written = json.dumps(mixture) if mixture else "–"
        shares = {t: c.get("share") for t, c in comp.get(r["stage"], {}).items()}
        if not shares:
            shares = {x["task"]: x["value"] for x in mix.filter(pl.col("stage") == r["stage"]).iter_rows(named=True)}
        effective = ", ".join(f"{t} {s:.0%}" for t, s in sorted(shares.items(), key=lambda kv: -kv[1]) if s)
        rows.append({"stage": r["stage"], "steps": f"{r['start']} → {r['end']}", "init": spec.get("init", "–"),
                     "mixture (as written)": written, "effective mixture": effective or "–",
                     "lr": (spec.get("optim") or {}).get("lr"), "batch": spec.get("batch_size")})
    return pl.DataFrame(rows)


def _findings(frame: pl.DataFrame, run_dir: Path, splits: list[str], primary: str, metric: str,
              events: pl.DataFrame, delta: float, expected: set[str], mode_events: pl.DataFrame) -> list[str]:
    """What a reader should look at first, in sentences (every number read from the data)."""
    out: list[str] = []
    e = html.escape
    try:
        st = F.stage_table(frame, metric, primary)
    except AnalysisError:
        return [f"no {e(metric)} rows yet"]
    tasks = [c for c in st.columns if c not in ("run_id", "stage", "step")]
    last = st.row(-1, named=True)
    ranked = sorted(((last[t], t) for t in tasks if last[t] is not None), reverse=True)
    out.append(f"At the end (step {last['step']}, stage <b>{e(last['stage'])}</b>), {e(metric)} on "
               f"{e(P.SPLIT_TITLES.get(primary, primary))}: "
               + ", ".join(f"{e(t)} <b>{fmt(v)}</b>" for v, t in ranked) + ".")
    # Largest fall between consecutive stage ends, and peaks lost by the end.
    drops = []
    for a, b in zip(st.iter_rows(named=True), list(st.iter_rows(named=True))[1:]):
        for t in tasks:
            if a[t] is not None and b[t] is not None and a[t] - b[t] > 1e-9:
                drops.append((a[t] - b[t], t, a["stage"], b["stage"], a[t], b[t]))
    if drops:
        d, t, s1, s2, v1, v2 = max(drops)
        out.append(f"Largest stage-to-stage fall: <b>{e(t)}</b> {fmt(v1)} → {fmt(v2)} from the end of "
                   f"{e(s1)} to the end of {e(s2)}.")
    for m in dict.fromkeys([metric, "mode_ok"]):
        rows = F.eval_rows(frame, [m], primary)
        if rows.is_empty():
            continue
        final = rows.filter(pl.col("step") == rows["step"].max()).unique("task", keep="last")
        end = dict(zip(final["task"].to_list(), final["value"].to_list()))
        # Peaks after training started (the base model's babble is often "in form": not a thing learned).
        peaks = rows.filter(pl.col("step") > rows["step"].min()).group_by("task").agg(pl.col("value").max().alias("peak"),
                                          pl.col("step").sort_by("value").last().alias("at"))
        lost = [(r["peak"] - end[r["task"]], r["task"], r["peak"], r["at"]) for r in peaks.iter_rows(named=True)
                if end.get(r["task"]) is not None and r["peak"] - end[r["task"]] >= delta - 1e-9]
        for gap, t, peak, at in sorted(lost, reverse=True)[:3]:
            what = "learned, then lost" if m == metric else "answered in the right form, then lost it"
            out.append(f"<b>{e(t)}</b> {e(m)} peaked at {fmt(peak)} (step {at}) and ended at {fmt(end[t])}: "
                       f"{what}.")
    # Seesaw events.
    if events.is_empty():
        out.append(f"No seesaw events at δ = {delta:g} (no evaluation where one task rose by δ while another fell "
                   "by δ).")
    else:
        parts = []
        for (m, sp, a, b), block in events.group_by("metric", "split", "step_from", "step_to", maintain_order=True):
            rose = ", ".join(dict.fromkeys(block["rose"].to_list()))
            fell = ", ".join(dict.fromkeys(block["fell"].to_list()))
            parts.append(f"{e(m)} on {e(sp)}, step {a} → {b}: ↑ {e(rose)} ↓ {e(fell)}")
        shown = "; ".join(parts[:4]) + (f"; and {len(parts) - 4} more" if len(parts) > 4 else "")
        out.append(f"<b>{events.height} seesaw event{'s' if events.height > 1 else ''}</b> at δ = {delta:g}: "
                   f"{shown}.")
    if not mode_events.is_empty():
        parts = [f"step {r['step_from']} → {r['step_to']} on {e(r['split'])}: ↑ {e(r['rose'])} "
                 f"+{r['rose_by']:.2f} ↓ {e(r['fell'])} −{r['fell_by']:.2f}"
                 for r in mode_events.iter_rows(named=True)][:4]
        out.append(f"The seesaw in answer <b>form</b> (mode_ok, outside the in-run definition): "
                   f"{mode_events.height} event{'s' if mode_events.height > 1 else ''} — " + "; ".join(parts)
                   + ("; …" if mode_events.height > 4 else "") + ".")
    # First-token hijack of tasks whose answers do not start with yes/no.
    try:
        tl = F.hijack_timeline(frame)
    except AnalysisError:
        tl = None
    if tl is not None and not tl.is_empty():
        end = tl.filter(pl.col("step") == tl["step"].max())
        for (sp,), block in end.group_by("split", maintain_order=True):
            hit = [r for r in block.sort("ft_hijack", descending=True, nulls_last=True).iter_rows(named=True)
                   if r["task"] not in expected and r["ft_hijack"] is not None and r["ft_hijack"] >= 0.5]
            if hit:
                out.append(f"<b>First-token hijack</b> at the end on {e(P.SPLIT_TITLES.get(sp, sp))} (share of "
                           "prompts whose most likely first token is a hijack word): "
                           + "; ".join(f"{e(r['task'])} <b>{r['ft_hijack']:.0%}</b> (most common top-1 "
                                       f"{e(repr(r['top1']))}; the gold first token ranks "
                                       f"{fmt_rank(r['ft_rank_median'])})" for r in hit) + ".")
    # Empty answers: the model ends its turn at once.
    try:
        samples = F.load_samples(run_dir)
    except Exception:  # noqa: BLE001 - a report still renders without samples
        samples = pl.DataFrame()
    if not samples.is_empty() and "pred" in samples.columns:
        final = samples.filter(pl.col("step") == samples["step"].max(), pl.col("split") == primary)
        final = final.filter(pl.col("stage") == final["stage"][-1]) if final.height else final
        sizes = final.group_by("task").len().sort("task")
        if sizes.height:
            n_min, n_max = sizes["len"].min(), sizes["len"].max()
            size = f"{n_min}" if n_min == n_max else f"{n_min}–{n_max}"
            out.append(f"<span class='note'>Evaluation sets: {size} items per task on {e(primary)}, so one item "
                       f"moves a score by {1 / n_max:.3f}"
                       + (f"–{1 / n_min:.3f}" if n_min != n_max else "") + f" (δ = {delta:g}).</span>")
        empty = (final.group_by("task").agg((pl.col("pred").fill_null("").str.strip_chars() == "").mean().alias("e"))
                 .filter(pl.col("e") >= 0.25).sort("e", descending=True))
        if not empty.is_empty():
            out.append("<b>Empty answers</b> at the end (the model ends its turn at once): "
                       + ", ".join(f"{e(r['task'])} {r['e']:.0%}" for r in empty.iter_rows(named=True)) + ".")
    # Memorisation: train-split items vs held-out.
    if "train" in splits and primary != "train":
        try:
            tr = F.stage_table(frame, metric, "train").row(-1, named=True)
            gaps = [(tr[t] - last[t], t) for t in tasks if tr.get(t) is not None and last[t] is not None]
            for gap, t in sorted(gaps, reverse=True)[:3]:
                if gap >= 0.25:
                    out.append(f"<b>{e(t)}</b>: {fmt(tr[t])} on training items vs {fmt(last[t])} held out — "
                               "memorised rather than learned.")
        except AnalysisError:
            pass
    return out


def run_report(run_dir: PathLike, out: Optional[PathLike] = None, *, metric: str = "greedy",
               delta: Optional[float] = None, failures: int = 3) -> Path:
    """Write ``report.html`` and its PNGs for one run into ``out`` (default ``RUN_DIR/report``); returns the HTML
    path."""
    started = time.perf_counter()
    run_dir = Path(run_dir)
    out = Path(out) if out is not None else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    frame = load_run(run_dir)
    if frame.is_empty():
        raise AnalysisError(f"{run_dir}: the store is empty (the run has not evaluated yet)")
    config = read_config(run_dir)
    summary = read_summary(run_dir)
    delta = float(delta if delta is not None else (config.get("eval") or {}).get("seesaw_delta", 0.15))
    evals = F.eval_rows(frame)
    splits = list(dict.fromkeys(s for s in (config.get("eval") or {}).get("splits", []) if s in
                                evals["split"].unique().to_list())) or sorted(evals["split"].unique().to_list())
    primary = "heldout" if "heldout" in splits else splits[0]
    tasks = sorted(evals["task"].unique().to_list())
    colors = P.task_colors(tasks)
    events = F.seesaw_events(frame, delta)
    # The in-run definition reads greedy and ft_hijack; the same definition on mode_ok shows a seesaw in the answers'
    # *form* (yes/no vs open answers) that exact match at 0 would hide.
    mode_events = F.seesaw_events(frame, delta, metrics=["mode_ok"])
    expected = F.hijack_tasks(run_dir)
    bounds = F.stage_bounds(frame)
    name = config.get("name") or summary.get("experiment") or run_dir.name
    run_id = frame["run_id"][0]

    page = Page(out, f"{name} — run report")
    e = html.escape

    page.section("Findings", "findings")
    items = _findings(frame, run_dir, splits, primary, metric, events, delta, expected, mode_events)
    page.raw("<ul class='findings'>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>")
    if not summary:
        page.p("The run has not finished (no summary.json): this report shows what the store holds so far.", "note")

    page.section("Curriculum", "curriculum")
    page.raw(table(_stage_rows(config, summary, bounds, frame)))
    page.figure(lambda: P.plot_composition(frame, colors), "composition.png",
                "Effective mixture per stage: the share of training examples of each task actually drawn.")

    page.section("Stage-end table", "stage-table")
    page.p(f"{e(metric)} at the last evaluation of each stage (the seed's comparison table). The small number is "
           f"the change from the previous stage's end; <span class='down'>red</span>: a fall of at least "
           f"δ = {delta:g}.")
    for split in splits:
        page.h3(f"{metric} · {P.SPLIT_TITLES.get(split, split)} ({split})")
        page.raw(stage_table_html(F.stage_table(frame, metric, split), metric, delta))
    others = [m for m in ("mode_ok", "tf_first", "ft_hijack", "ft_rank_median")
              if m != metric and not F.eval_rows(frame, [m], primary).is_empty()]
    if others:
        inner = "".join(f"<h3>{e(m)} · {e(primary)}</h3>" + stage_table_html(F.stage_table(frame, m, primary), m,
                                                                              delta if m != "ft_rank_median" else 1e9)
                        for m in others)
        page.raw(f"<details><summary>{', '.join(others)} at stage ends ({e(primary)})</summary>{inner}</details>")

    page.section("Curves", "curves")
    page.figure(lambda: P.plot_curves(frame, metric, splits, events, tasks, colors), f"curves_{metric}.png",
                f"Per-task {e(metric)} at every evaluation across the curriculum; grey bands are stages. "
                f"▲/▼: a seesaw event (one task rose by ≥ {delta:g} while another fell by ≥ {delta:g}).")
    loss_metric = "eval_loss" if not F.eval_rows(frame, ["eval_loss"], splits).is_empty() else "loss"
    for m, caption in (("mode_ok", "Share of greedy answers in the task's form (yes/no answers start with yes/no, "
                                   "open answers must not…): a format collapse shows here before accuracy."),
                       (loss_metric, "Answer-token loss per task on the evaluation items (teacher forced).")):
        if m != metric and not F.eval_rows(frame, [m], splits).is_empty():
            page.figure(lambda m=m: P.plot_curves(frame, m, splits, pl.concat([events, mode_events]), tasks, colors),
                        f"curves_{m}.png",
                        caption)

    page.section("First token", "first-token")
    page.figure(lambda: P.plot_hijack(frame, splits, colors, expected, events), "first_token.png",
                "Top: share of prompts whose most likely first answer token is a hijack word "
                f"({e(', '.join(map(str, (config.get('eval') or {}).get('hijack_words') or ['yes', 'no'])))}). "
                "Bottom: median rank of the gold first token among the whole vocabulary (1 = top; up is better). "
                + ("Dashed: tasks whose answers do start with yes/no." if expected else ""))
    top = F.top1_table(frame, primary)
    if not top.is_empty():
        page.h3(f"Most common top-1 first tokens at each stage end ({primary})")
        wide = top.pivot(on="stage", index="task", values="tokens", aggregate_function="first")
        page.raw(table(wide))

    page.section("Seesaw events", "events")
    page.p(f"Between consecutive evaluations, one task rose by at least δ = {delta:g} while another fell by at "
           "least δ (the in-run definition; metrics greedy and ft_hijack — for ft_hijack a rise is bad).")
    page.raw(table(events.drop("run_id")))
    if not mode_events.is_empty():
        page.h3("The same definition on mode_ok (the answer's form; not part of the in-run events)")
        page.raw(table(mode_events.drop("run_id")))

    page.section("Worst failures", "failures")
    page.p(f"At the final evaluation: up to {failures} wrong answers per task and split, the most confidently wrong "
           "first (gold first token ranked lowest).")
    worst = F.worst_failures(run_dir, failures)
    if worst.is_empty():
        page.p("(no samples.jsonl, or no failures)", "note")
    else:
        for (task,), block in worst.group_by("task", maintain_order=True):
            counts = block.select("split", "failures", "items").unique(maintain_order=True)
            rate = ", ".join(f"{r['split']}: {r['failures']}/{r['items']} wrong" for r in counts.iter_rows(named=True))
            page.h3(f"{task} — {rate}")
            shown = block.select(
                "split", pl.col("prompt").map_elements(F.readable_prompt, return_dtype=pl.Utf8), "gold", "pred",
                "mode_ok", pl.col("gold_first_rank").alias("gold rank"), pl.col("top5").alias("top-5 first tokens"))
            page.raw(table(shown, wrap=("prompt", "gold", "pred", "top-5 first tokens"),
                           cell=lambda c, v, r: "<i>(empty)</i>" if c == "pred" and not (v or "").strip() else None))

    page.section("Training", "training")
    page.figure(lambda: P.plot_training(frame, colors), "training.png",
                "Training loss (overall in black, per task in colour), learning rate, gradient norm and update ratio.")

    page.section("Run", "run")
    facts = {"run id": run_id, "run directory": str(run_dir.resolve()), "experiment": name}
    base = summary.get("base") or {}
    if base:
        facts["base model"] = f"{base.get('source')} (cache {'hit' if base.get('cache_hit') else 'miss'})"
    timing = summary.get("timing") or {}
    if timing:
        facts["time"] = (f"{timing.get('total_s', 0):.1f}s in all, evaluation "
                         f"{100 * timing.get('eval_share', 0):.0f}%")
    facts["report"] = f"harness report {run_dir} --out {out} ({time.perf_counter() - started:.1f}s)"
    page.raw(table(pl.DataFrame({"": list(facts), "value": [str(v) for v in facts.values()]})))
    config_path = run_dir / "config.resolved.yaml"
    if config_path.is_file():
        page.raw(f"<details><summary>config.resolved.yaml</summary><pre>{e(config_path.read_text())}</pre></details>")
    subtitle = (f"run <code>{e(run_id)}</code> · {len(bounds)} stages · {bounds['end'].max()} steps · "
                f"{len(tasks)} tasks · splits {e(', '.join(splits))} · seesaw δ = {delta:g}")
    return page.write(subtitle)


# ----------------------------------------------------------------------------------------------------------------
# Sweep report
# ----------------------------------------------------------------------------------------------------------------


def sweep_report(sweep_dir: PathLike, out: Optional[PathLike] = None, *, metric: Optional[str] = None,
                 split: Optional[str] = None) -> Path:
    """Write ``report.html`` and its PNGs for a sweep into ``out`` (default ``SWEEP_DIR/report``)."""
    sweep_dir = Path(sweep_dir)
    out = Path(out) if out is not None else sweep_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    trials = load_sweep(sweep_dir)
    config = read_sweep_config(sweep_dir)
    obj = S.sweep_objective(config)
    metric = metric or obj["metric"]
    split = split or obj["split"]
    objectives = S.objective_columns(trials)
    done = S.complete(trials)
    states = Counter(trials["state"].to_list()) if "state" in trials.columns else Counter({"COMPLETE": trials.height})
    maximize = obj["direction"] == "maximize" if obj.get("direction") else not F.lower_is_better(metric)
    directions = S.objective_directions(config, objectives)
    e = html.escape
    name = (config.get("study") or {}).get("name") or sweep_dir.name
    page = Page(out, f"{name} — sweep report")

    # Fits (one per simplex parameter) first: the findings read them.
    fits, fit_errors = [], []
    groups = S.simplex_groups(trials, config.get("space"))
    for path in groups:
        try:
            targets = [t for t in S.metric_columns(trials).filter(pl.col("metric") == metric,
                                                                  pl.col("split") == split)["task"].unique()]
            fit = S.interference(trials, metric, split, path=path, stage=obj.get("stage"), space=config.get("space"),
                                 maximize=maximize, **S.fit_objective(obj, sorted(targets)))
            fits.append(fit)
        except AnalysisError as err:
            fit_errors.append(f"{path}: {err}")

    page.section("Findings", "findings")
    findings = [f"{trials.height} trials: " + ", ".join(f"{n} {s.lower()}" for s, n in states.most_common()) + "."]
    if objectives and done.height:
        best = S.best_trials(trials, 1, objectives[0], directions[0] == "max").row(0, named=True)
        findings.append(f"Best trial <b>#{best.get('number')}</b>: {e(objectives[0])} = <b>{fmt(best[objectives[0]])}</b>"
                        + (f" ({e(obj['reduce'])} of {e(metric)} over {e(', '.join(obj['tasks']))} on {e(split)})"
                           if obj.get("tasks") else "") + ".")
        values = done[objectives[0]].drop_nulls()
        if values.len() > 1 and values.max() - values.min() < 1e-12:
            findings.append(f"<b>Every complete trial has the same objective ({fmt(values[0])})</b>: the sweep did "
                            "not tell the mixtures apart (too few steps or evaluation items, or a metric stuck at "
                            "its floor); nothing below can rank mixtures by it.")
    for fit in fits:
        cells = [(fit.effect.filter(pl.col("weight") == w)[t].item(), w, t) for w in fit.weights for t in fit.targets
                 if w != t]
        if cells and fit.verdict in ("good", "fair"):
            worst = min(cells) if maximize else max(cells)
            findings.append(f"Strongest interference ({e(fit.path)}): raising <b>{e(worst[1])}</b> by {fit.per:g} moves "
                            f"<b>{e(worst[2])}</b> {e(fit.metric)} by <b>{worst[0]:+.3f}</b> ({fit.verdict} fit).")
        findings.append("Fit: " + e(fit.quality))
        findings.append(("Predicted best mixture (" if fit.verdict in ("good", "fair") else
                         "Predicted best mixture — <b>not to be trusted, the fit is " + fit.verdict + "</b> (")
                        + e(fit.objective) + "): "
                        + ", ".join(f"{e(w)} {v:.2f}" for w, v in fit.best_mixture.items())
                        + f" → predicted {fit.best_objective:.3f}; best observed trial "
                        f"#{fit.best_observed['number']}: {fit.best_observed['objective']:.3f}.")
    findings.extend(e(x) for x in fit_errors)
    page.raw("<ul class='findings'>" + "".join(f"<li>{i}</li>" for i in findings) + "</ul>")

    page.section("Best trials", "best")
    if objectives and done.height:
        top = S.best_trials(trials, 10, objectives[0], directions[0] == "max")
        params = [c for c in trials.columns if c.startswith("param/")]
        keep = ["number", *objectives, *params, "duration_s"]
        shown = top.select([c for c in keep if c in top.columns])
        page.raw(table(shown.rename({c: c[len("param/"):] for c in params})))
        page.figure(lambda: P.plot_history(trials, objectives[0], directions[0] == "max"), "history.png",
                    "Objective per trial in order; the red step is the best so far.")
    else:
        page.p("(no complete trial with an objective yet)", "note")

    page.section("Interference", "interference")
    if not fits:
        page.p("(no fit: " + e("; ".join(fit_errors) or "no mixture weights in the trials") + ")", "note")
    for i, fit in enumerate(fits):
        suffix = "" if len(fits) == 1 else f"_{i}"
        page.h3(f"{fit.path}: {fit.metric} ({fit.split}) at the end of {fit.stage}")
        page.figure(lambda fit=fit: P.plot_interference(fit), f"interference{suffix}.png",
                    f"Row: a task's weight raised by {fit.per:g} (taken from the others in proportion, at the sweep's "
                    "mean mixture); column: the change in each task's metric predicted by a linear mixture model "
                    "fitted over the complete trials (RegMix-style). Negative off-diagonal cells are the seesaw.")
        page.p(e(fit.quality))
        mix = pl.DataFrame({"task": fit.weights,
                            "sweep mean": [fit.mean_mixture[w] for w in fit.weights],
                            "sweep range": [f"{fit.weight_range[w][0]:.2f}–{fit.weight_range[w][1]:.2f}"
                                            for w in fit.weights],
                            f"best observed (#{fit.best_observed['number']})":
                                [fit.best_observed["mixture"][w] for w in fit.weights],
                            "predicted best": [fit.best_mixture[w] for w in fit.weights]})
        page.raw("<h3>Mixtures</h3>" + table(mix))
        pred = pl.DataFrame({"task": fit.targets,
                             f"observed at #{fit.best_observed['number']}":
                                 [fit.best_observed["metrics"][t] for t in fit.targets],
                             "predicted at the best mixture": [fit.best_predicted[t] for t in fit.targets],
                             "R²": [fit.r2[t] for t in fit.targets], "LOO R²": [fit.loo_r2[t] for t in fit.targets]})
        page.raw(f"<h3>{e(fit.metric)} per task</h3>" + table(pred))
        page.raw("<details><summary>Scheffé coefficients (the predicted metric for a stage of one task alone — "
                 "an extrapolation)</summary>" + table(fit.coef) + "</details>")
        page.figure(lambda fit=fit: P.plot_partial_dependence(trials, fit), f"partial_dependence{suffix}.png",
                    "Weight → metric: dots are trials; lines move one weight across the range the sweep tried, the "
                    "others keeping their mean proportions (the fitted model). Dotted: the predicted best mixture.")

    page.section("Pareto front", "pareto")
    pair = S.tradeoff_pair(trials, objectives, metric, split, fits[0].stage if fits else None)
    if pair is None:
        page.p("(needs two objectives, or two task metrics, over complete trials)", "note")
    else:
        x, y, why = pair
        front = S.pareto(trials, [x, y], directions if [x, y] == objectives[:2] else None)
        page.p(e(why))
        page.figure(lambda: P.plot_pareto(front, x, y), "pareto.png",
                    "Complete trials on two metrics; red: not beaten on both by any other trial.")
        params = [c for c in trials.columns if c.startswith("param/")]
        page.raw(table(front.filter(pl.col("pareto")).select(
            [c for c in ("number", x, y, *params) if c in front.columns]).rename(
            {c: c[len("param/"):] for c in params})))

    page.section("Failed and pruned trials", "failed")
    if "state" in trials.columns:
        bad = trials.filter(pl.col("state").is_in(["FAIL", "PRUNED"]))
        cols = [c for c in ("number", "state", "pruned_step", "fail_reason", "duration_s") if c in bad.columns]
        page.raw(table(bad.select(cols), wrap=("fail_reason",)))

    page.section("Best trial's curves", "best-run")
    best_dir = S.best_trial_dir(trials, sweep_dir, directions[0] == "max" if directions else maximize)
    if best_dir is None:
        page.p("(the best trial's run directory is not available)", "note")
    else:
        run_frame = load_run(best_dir)
        page.p(f"Trial run directory: <code>{e(str(best_dir))}</code> — <code>harness report {e(str(best_dir))}"
               "</code> for its full report.")
        run_events = F.seesaw_events(run_frame, float((read_config(best_dir).get("eval") or {}).get("seesaw_delta",
                                                                                                     0.15)))
        page.figure(lambda: P.plot_curves(run_frame, metric, None, run_events), "best_trial_curves.png",
                    f"The best trial's per-task {e(metric)} across its curriculum.")

    page.section("Sweep", "sweep")
    path = sweep_dir / "sweep.resolved.yaml"
    page.raw(table(pl.DataFrame({"": ["sweep directory", "trials", "report"],
                                 "value": [str(sweep_dir.resolve()), str(trials.height),
                                           f"harness report {sweep_dir} --out {out}"]})))
    if path.is_file():
        page.raw(f"<details><summary>sweep.resolved.yaml</summary><pre>{e(path.read_text())}</pre></details>")
    subtitle = (f"{trials.height} trials · {done.height} complete · objective "
                f"{e(', '.join(objectives) or '–')} · analysed metric {e(metric)} on {e(split)}")
    return page.write(subtitle)


def write_report(path: PathLike, out: Optional[PathLike] = None, **options: Any) -> Path:
    """The report of a run directory or a sweep directory (whichever ``path`` is); returns ``report.html``."""
    path = Path(path)
    if is_sweep_dir(path):
        return sweep_report(path, out, **options)
    if is_run_dir(path):
        return run_report(path, out, **options)
    raise AnalysisError(f"{path}: neither a run directory (metrics.parquet) nor a sweep directory (trials.parquet)")
