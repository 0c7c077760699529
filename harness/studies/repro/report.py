"""The output of ``harness repro``: the table (``NAME.md``), the figure (``NAME.png``) and ``results.json``.

Per arm and metric: the mean over seeds with its 95 % interval across seeds (:func:`across_seeds`: over the seeds
and the items, inside [0, 1], never zero-width while items vary; none from one seed, which the table says), and
each run's rate with its 95 % Wilson interval and n. The published direction (``expect``) is tested as a paired
difference across seeds (the arms of one seed share its data draw and initialisation): a Student-t interval of the
per-seed differences, cut at −1 and 1.

Every interval and test is :mod:`harness.core.stats`'s.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from harness.core import stats as stats_
from harness.studies.repro.plan import Repro, RunOutcome

CONFIDENCE = 0.95


def across_seeds(runs: list[RunOutcome], label: str) -> dict[str, Any]:
    """``{mean, low, high, method}`` of one arm's rate ``label`` over its seeds. Runs on the same task data (one
    data seed) with per-item outcomes: :func:`harness.core.stats.seeds_items_interval`; otherwise from the rates
    (:func:`~harness.core.stats.seeds_rates_interval`, ``same_items`` when the data seeds are equal — conservative
    — and not when each seed drew its own items, as ``seed=<s>`` alone does). One seed: no interval."""
    kept = [o for o in runs if not math.isnan(o.values[label])]
    values = [o.values[label] for o in kept]
    if len(kept) < 2:
        mean = values[0] if values else math.nan
        return {"mean": mean, "low": math.nan, "high": math.nan, "method": "none: one seed"}
    same_items = len({o.data_seed for o in kept}) == 1
    items = [o.items.get(label) for o in kept]
    if same_items and all(items) and all(i.keys() == items[0].keys() for i in items):
        order = sorted(items[0])
        ci = stats_.seeds_items_interval([[float(i[k]) for k in order] for i in items], CONFIDENCE)
        method = "seeds × items"
    else:
        own = len({o.data_seed for o in kept}) == len(kept)
        ci = stats_.seeds_rates_interval(values, min(o.n[label] for o in kept), CONFIDENCE, same_items=not own)
        method = "seeds (own items each)" if own else "seeds × items (from rates)"
    return {"mean": sum(values) / len(values), "low": ci.low, "high": ci.high, "method": method}


def paired_difference(outcomes: list[RunOutcome], higher: str, lower: str, label: str) -> dict[str, Any]:
    """``higher − lower`` on ``label`` over the seeds both arms ran: mean, 95 % t-interval, paired t-test p
    (NaN below 2 seeds), and per seed."""
    by = {(o.arm, o.seed): o.values.get(label, math.nan) for o in outcomes}
    seeds = sorted({s for a, s in by if a == higher} & {s for a, s in by if a == lower})
    diffs = [by[(higher, s)] - by[(lower, s)] for s in seeds]
    mean, low, high, _ = stats_.t_interval(diffs, CONFIDENCE)
    if not math.isnan(low):  # a difference of two rates ends at −1 and 1; NaN (one seed) stays NaN, not [−1, 1]
        low, high = max(-1.0, low), min(1.0, high)
    p = math.nan
    if len(seeds) >= 2 and np.std(diffs) > 0:
        p = float(stats.ttest_rel([by[(higher, s)] for s in seeds], [by[(lower, s)] for s in seeds]).pvalue)
    return {
        "higher": higher,
        "lower": lower,
        "metric": label,
        "seeds": seeds,
        "diffs": diffs,
        "mean": mean,
        "low": low,
        "high": high,
        "p_paired_t": p,
    }


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
        out.append(
            {"seed": seed, "n": len(a), "only_higher": only_higher, "only_lower": only_lower, "p_mcnemar_exact": p}
        )
    return out


def summarise(repro: Repro, outcomes: list[RunOutcome]) -> dict[str, Any]:
    """Everything the table and the figure show, JSON-ready."""
    spec = repro.spec
    arms: dict[str, Any] = {}
    for arm in dict.fromkeys(o.arm for o in outcomes):
        runs = [o for o in outcomes if o.arm == arm]
        arms[arm] = {"x": spec.arm(arm).x, "metrics": {}}
        for m in spec.metrics:
            across = across_seeds(runs, m.label)
            per_run = []
            for o in runs:
                n = o.n[m.label]
                k = round(o.values[m.label] * n) if not math.isnan(o.values[m.label]) else 0
                ci = stats_.wilson_interval(k, n, CONFIDENCE)  # NaN bounds when the run had no items
                per_run.append(
                    {
                        "seed": o.seed,
                        "value": o.values[m.label],
                        "n": n,
                        "wilson": [ci.low, ci.high],
                        "seconds": o.seconds,
                    }
                )
            arms[arm]["metrics"][m.label] = {
                "mean": across["mean"],
                "low": across["low"],
                "high": across["high"],
                "across": across["method"],
                "runs": per_run,
            }
    result: dict[str, Any] = {
        "name": repro.name,
        "title": spec.title,
        "source": spec.source,
        "published": spec.published,
        "arms": arms,
    }
    if spec.expect and spec.expect.higher in arms and spec.expect.lower in arms:
        result["direction"] = paired_difference(outcomes, spec.expect.higher, spec.expect.lower, spec.metrics[0].label)
        result["direction"]["per_seed_items"] = paired_items(
            outcomes, spec.expect.higher, spec.expect.lower, spec.metrics[0].label
        )
    return result


def _fmt(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.3f}"


def _across_text(m: dict[str, Any]) -> str:
    if m["across"].startswith("none"):
        return f"{_fmt(m['mean'])} (one seed: its Wilson interval; no interval across seeds)"
    return f"{_fmt(m['mean'])} [{_fmt(m['low'])}, {_fmt(m['high'])}]"


def markdown(result: dict[str, Any], command: str, figure: str | None) -> str:
    """The reproduction's table as Markdown."""
    lines = [
        f"# {result['title']}",
        "",
        f"Source: {result['source']}. Published: {result['published']}",
        "",
        f"Command: `{command}`",
        "",
        "| arm | metric | mean over seeds [95 % interval across seeds and items] | runs: seed value "
        "[95 % Wilson] (n) |",
        "|---|---|---|---|",
    ]
    for arm, info in result["arms"].items():
        for label, m in info["metrics"].items():
            runs = "; ".join(
                f"s{r['seed']} {_fmt(r['value'])} [{_fmt(r['wilson'][0])}, {_fmt(r['wilson'][1])}] ({r['n']})"
                for r in m["runs"]
            )
            lines.append(f"| {arm} | {label} | {_across_text(m)} | {runs} |")
    d = result.get("direction")
    if d:
        lines += [
            "",
            f"Published direction, {d['higher']} − {d['lower']} on {d['metric']} (paired over seeds "
            f"{d['seeds']}): {_fmt(d['mean'])} [{_fmt(d['low'])}, {_fmt(d['high'])}], paired t-test "
            f"p = {_fmt(d['p_paired_t'])}.",
        ]
        lines += [
            f"Seed {x['seed']}, paired on its {x['n']} items: only {d['higher']} right {x['only_higher']}, only "
            f"{d['lower']} right {x['only_lower']}, exact McNemar p = {x['p_mcnemar_exact']:.2g}."
            for x in d["per_seed_items"]
        ]
    if figure:
        lines += ["", f"![{result['name']}]({figure})"]
    return "\n".join(lines) + "\n"


def figure(result: dict[str, Any], path: Path, x_label: str | None = None, x_log: bool = False) -> Path:
    """One panel per metric: arms with an ``x`` as a line over x, the others as bars; mean with its interval across
    seeds and each seed's value as a dot."""
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
    lows = [m["mean"] - m["low"] if not math.isnan(m["low"]) else 0.0 for m in metrics]
    highs = [m["high"] - m["mean"] if not math.isnan(m["high"]) else 0.0 for m in metrics]
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
