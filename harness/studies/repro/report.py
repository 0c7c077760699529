"""The output of ``harness repro``: the table (``NAME.md``), the figure (``NAME.png``) and ``results.json``.

Per arm and metric: the mean over seeds with its 95 % t-interval (Student t, n_seeds − 1 degrees of freedom; none
from one seed), and each run's rate with its 95 % Wilson interval and n. The published direction (``expect``)
is tested as a paired difference across seeds (the arms of one seed share its data draw and initialisation).

The intervals and the McNemar test are :mod:`harness.core.stats`'s; the wrappers here keep this module's tuple shape.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import numpy as np
from scipy import stats

from harness.core import stats as stats_
from harness.studies.repro.plan import Repro, RunOutcome

CONFIDENCE = 0.95


def wilson_interval(successes: int, n: int) -> tuple[float, float]:
    """95 % Wilson score interval of ``successes`` in ``n`` (:func:`harness.core.stats.wilson_interval`; ``(0, 1)``
    when n is 0)."""
    if n <= 0:
        return 0.0, 1.0
    ci = stats_.wilson_interval(int(successes), int(n), CONFIDENCE)
    return ci.low, ci.high


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """``(mean, low, high)``: the 95 % Student-t interval of the mean (:func:`harness.core.stats.t_interval`); low/high
    NaN with fewer than 2 values."""
    ci = stats_.t_interval(values, CONFIDENCE)
    return ci.estimate, ci.low, ci.high


def paired_difference(outcomes: list[RunOutcome], higher: str, lower: str, label: str) -> dict[str, Any]:
    """``higher − lower`` on ``label`` over the seeds both arms ran: mean, 95 % t-interval, paired t-test p
    (NaN below 2 seeds), and per seed."""
    by = {(o.arm, o.seed): o.values.get(label, math.nan) for o in outcomes}
    seeds = sorted({s for a, s in by if a == higher} & {s for a, s in by if a == lower})
    diffs = [by[(higher, s)] - by[(lower, s)] for s in seeds]
    mean, low, high = t_interval(diffs)
    p = math.nan
    if len(seeds) >= 2 and np.std(diffs) > 0:
        p = float(stats.ttest_rel([by[(higher, s)] for s in seeds], [by[(lower, s)] for s in seeds]).pvalue)
    return {"higher": higher, "lower": lower, "metric": label, "seeds": seeds, "diffs": diffs, "mean": mean,
            "low": low, "high": high, "p_paired_t": p}


def paired_items(outcomes: list[RunOutcome], higher: str, lower: str, label: str) -> list[dict[str, Any]]:
    """Per seed, the item-level paired comparison of two arms on the same held-out items (same seed, same data
    draw): items only ``higher`` got right, only ``lower`` got right, and the exact McNemar p (two-sided binomial
    test on the discordant pairs)."""
    by = {(o.arm, o.seed): o.items.get(label) for o in outcomes}
    out = []
    for seed in sorted({o.seed for o in outcomes}):
        a, b = by.get((higher, seed)), by.get((lower, seed))
        if not a or not b or set(a) != set(b):
            continue
        only_higher = sum(a[i] and not b[i] for i in a)
        only_lower = sum(b[i] and not a[i] for i in a)
        p = float(stats_.mcnemar_exact(only_higher, only_lower))
        out.append({"seed": seed, "n": len(a), "only_higher": only_higher, "only_lower": only_lower,
                    "p_mcnemar_exact": p})
    return out


def summarise(repro: Repro, outcomes: list[RunOutcome]) -> dict[str, Any]:
    """Everything the table and the figure show, JSON-ready."""
    spec = repro.spec
    arms: dict[str, Any] = {}
    for arm in dict.fromkeys(o.arm for o in outcomes):
        runs = [o for o in outcomes if o.arm == arm]
        arms[arm] = {"x": spec.arm(arm).x, "metrics": {}}
        for m in spec.metrics:
            values = [o.values[m.label] for o in runs]
            mean, low, high = t_interval(values)
            per_run = []
            for o in runs:
                n = o.n[m.label]
                k = round(o.values[m.label] * n) if not math.isnan(o.values[m.label]) else 0
                lo, hi = wilson_interval(k, n)
                per_run.append({"seed": o.seed, "value": o.values[m.label], "n": n, "wilson": [lo, hi],
                                "seconds": o.seconds})
            arms[arm]["metrics"][m.label] = {"mean": mean, "t_low": low, "t_high": high, "runs": per_run}
    result: dict[str, Any] = {"name": repro.name, "title": spec.title, "source": spec.source,
                              "published": spec.published, "arms": arms}
    if spec.expect and spec.expect.higher in arms and spec.expect.lower in arms:
        result["direction"] = paired_difference(outcomes, spec.expect.higher, spec.expect.lower,
                                                spec.metrics[0].label)
        result["direction"]["per_seed_items"] = paired_items(outcomes, spec.expect.higher, spec.expect.lower,
                                                             spec.metrics[0].label)
    return result


def _fmt(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.3f}"


def markdown(result: dict[str, Any], command: str, figure: Optional[str]) -> str:
    """The reproduction's table as Markdown."""
    lines = [f"# {result['title']}", "", f"Source: {result['source']}. Published: {result['published']}", "",
             f"Command: `{command}`", "",
             "| arm | metric | mean over seeds [95 % t-interval] | runs: seed value [95 % Wilson] (n) |",
             "|---|---|---|---|"]
    for arm, info in result["arms"].items():
        for label, m in info["metrics"].items():
            runs = "; ".join(f"s{r['seed']} {_fmt(r['value'])} [{_fmt(r['wilson'][0])}, {_fmt(r['wilson'][1])}] "
                             f"({r['n']})" for r in m["runs"])
            lines.append(f"| {arm} | {label} | {_fmt(m['mean'])} [{_fmt(m['t_low'])}, {_fmt(m['t_high'])}] "
                         f"| {runs} |")
    d = result.get("direction")
    if d:
        lines += ["", f"Published direction, {d['higher']} − {d['lower']} on {d['metric']} (paired over seeds "
                      f"{d['seeds']}): {_fmt(d['mean'])} [{_fmt(d['low'])}, {_fmt(d['high'])}], paired t-test "
                      f"p = {_fmt(d['p_paired_t'])}."]
        lines += [f"Seed {x['seed']}, paired on its {x['n']} items: only {d['higher']} right {x['only_higher']}, only "
                  f"{d['lower']} right {x['only_lower']}, exact McNemar p = {x['p_mcnemar_exact']:.2g}."
                  for x in d["per_seed_items"]]
    if figure:
        lines += ["", f"![{result['name']}]({figure})"]
    return "\n".join(lines) + "\n"


def figure(result: dict[str, Any], path: Path, x_label: Optional[str] = None, x_log: bool = False) -> Path:
    """One panel per metric: arms with an ``x`` as a line over x, the others as bars; mean with its t-interval
    and each seed's value as a dot."""
    import matplotlib  # plotting only when a figure is written

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(next(iter(result["arms"].values()))["metrics"])
    fig, axes = plt.subplots(1, len(labels), figsize=(5 * len(labels), 3.6), squeeze=False)
    for ax, label in zip(axes[0], labels):
        swept = [(a, i) for a, i in result["arms"].items() if i["x"] is not None]
        others = [(a, i) for a, i in result["arms"].items() if i["x"] is None]
        if swept:
            swept.sort(key=lambda ai: ai[1]["x"])
            xs = [i["x"] for _, i in swept]
            _draw(ax, xs, [i["metrics"][label] for _, i in swept], line=True)
            ax.set_xscale("log" if x_log else "linear")
            ax.set_xlabel(x_label or "x")
            for colour, (a, i) in enumerate(others, start=1):  # reference arms as lines across the sweep
                ax.axhline(i["metrics"][label]["mean"], linestyle="--", linewidth=1, label=a, color=f"C{colour}")
            if others:
                ax.legend(fontsize=8)
        else:
            _draw(ax, list(range(len(others))), [i["metrics"][label] for _, i in others], line=False)
            ax.set_xticks(range(len(others)), [a for a, _ in others])
        ax.set_title(label, fontsize=10)
        ax.set_ylim(-0.02, 1.02)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _draw(ax, xs: list[float], metrics: list[dict[str, Any]], line: bool) -> None:
    means = [m["mean"] for m in metrics]
    lows = [m["mean"] - m["t_low"] if not math.isnan(m["t_low"]) else 0.0 for m in metrics]
    highs = [m["t_high"] - m["mean"] if not math.isnan(m["t_high"]) else 0.0 for m in metrics]
    ax.errorbar(xs, means, yerr=[lows, highs], fmt="-o" if line else "o", capsize=4)
    for x, m in zip(xs, metrics):
        ax.scatter([x] * len(m["runs"]), [r["value"] for r in m["runs"]], s=10, alpha=0.5, color="gray")


def write_outputs(repro: Repro, outcomes: list[RunOutcome], out: Path, command: str) -> Path:
    """Write ``NAME.md``, ``NAME.png`` and ``results.json`` into ``out``; returns the Markdown path."""
    out.mkdir(parents=True, exist_ok=True)
    result = summarise(repro, outcomes)
    png = figure(result, out / f"{repro.name}.png", repro.spec.x_label, repro.spec.x_log)
    (out / "results.json").write_text(json.dumps(result, indent=2, default=str))
    md = out / f"{repro.name}.md"
    md.write_text(markdown(result, command, png.name))
    return md
