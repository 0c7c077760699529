"""Two runs of one experiment compared value by value, each against a third run that differs from the first only
in summation order (the reference: how far rounding alone moves this experiment on this CPU). Used by
bench/chunked_identity.py (chunked loss on and off); the rules are written out in its docstring.

A run directory's ``metrics.parquet`` rows are matched on stage, step, task, split and metric (``tokens_per_s``, a
timing, left out) and their value, n, interval and text compared; its ``samples.jsonl`` records in order
(``run_id`` left out), every field, nested ones too.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any

TIMING = ("tokens_per_s",)
KEY = ["stage", "step", "task", "split", "metric"]  # unique per row; ``text`` is a value (ft_top1's counts)
VALUES = ["value", "n", "ci_low", "ci_high", "text"]
# Evaluation metrics made of per-item decisions (argmaxes, ranks, counts, seesaw events)
DISCRETE = ("ft_", "greedy", "tf_", "mode_ok", "answer_ok", "truncated", "choice_", "baseline_", "seesaw")
HEADLINE = ("loss", "grad_norm", "eval_loss")  # printed per stage
WORD = {True: "within", False: "outside"}
LOSS_STEPS = (1e-6, 1e-4, 1e-2, 1e-1)  # the training loss's divergence, reported as the first step past each


def relative(a: float, b: float) -> float:
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale else 0.0


def discrete(metric: str) -> bool:
    """An evaluation metric made of per-item decisions (argmaxes, ranks, counts): one item's flip moves it by a
    step, however small the rounding difference that flipped it."""
    return metric.startswith(DISCRETE)


def metrics(run: Path):
    import polars as pl

    frame = pl.read_parquet(run / "metrics.parquet").filter(~pl.col("metric").is_in(TIMING))
    return frame.select(KEY + VALUES)


def metric_differences(a: Path, b: Path) -> tuple[dict, dict, int, int]:
    """``(per metric: summary, per (metric, stage): largest relative difference, rows compared, rows unmatched)``
    of run ``b`` against run ``a`` (a differing ``text``, or a value present in one run only: relative inf)."""
    import polars as pl

    left, right = metrics(a), metrics(b)
    joined = left.join(right, on=KEY, how="full", suffix="_b", nulls_equal=True, coalesce=True)
    unmatched = joined.filter(pl.col("value").is_null() != pl.col("value_b").is_null()).height
    per_metric: dict[str, dict[str, Any]] = {}
    per_stage: dict[tuple[str, str], float] = {}
    order = {stage: i for i, stage in enumerate(dict.fromkeys(left["stage"].to_list()))}
    for row in joined.iter_rows(named=True):
        diff = [(row[c], row[c + "_b"]) for c in VALUES if row[c] != row[c + "_b"]]
        entry = per_metric.setdefault(row["metric"], {"rows": 0, "differ": 0, "abs": 0.0, "rel": 0.0, "first": None})
        entry["rows"] += 1
        key = (row["metric"], row["stage"])
        per_stage.setdefault(key, 0.0)
        if not diff:
            continue
        entry["differ"] += 1
        for x, y in diff:
            numeric = isinstance(x, (int, float)) and isinstance(y, (int, float))
            rel = relative(x, y) if numeric else math.inf
            entry["abs"] = max(entry["abs"], abs(x - y) if numeric else math.inf)
            entry["rel"], per_stage[key] = max(entry["rel"], rel), max(per_stage[key], rel)
        at = (order.get(row["stage"], len(order)), row["step"] if row["step"] is not None else -1)
        if entry["first"] is None or at < entry["first"][0]:
            entry["first"] = (at, f"{row['stage']}@{row['step']}")
    return per_metric, per_stage, joined.height, unmatched


def samples(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines() if line]
    for record in records:
        record.pop("run_id", None)
    return records


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in flatten(val, f"{prefix}{key}.").items()}
    if isinstance(obj, list):
        return {k: v for i, val in enumerate(obj) for k, v in flatten(val, f"{prefix}{i}.").items()} or {prefix: []}
    return {prefix.rstrip("."): obj}


def field_of(path: str) -> str:
    return re.sub(r"\.\d+(?=\.|$)", ".*", path)


def where(record: dict) -> str:
    return f"{record['stage']}@{record['step']} {record['task']}/{record['split']}#{record['index']}"


def sample_differences(left: list[dict], right: list[dict]) -> tuple[dict, int]:
    """``(per field: summary, records differing in any field)`` of ``right``'s records against ``left``'s; a field
    is its path with list indices as ``*`` (``top5.*.prob``)."""
    fields: dict[str, dict[str, Any]] = {}
    records_differing = 0
    for x, y in zip(left, right):
        fx, fy = flatten(x), flatten(y)
        differing = [k for k in fx.keys() | fy.keys() if fx.get(k) != fy.get(k)]
        records_differing += bool(differing)
        for field in {field_of(k) for k in differing}:
            entry = fields.setdefault(field, {"records": 0, "abs": None, "rel": None, "first": None})
            entry["records"] += 1
            entry["first"] = entry["first"] or where(x)
        for k in differing:
            u, v = fx.get(k), fy.get(k)
            if all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in (u, v)):
                entry = fields[field_of(k)]
                entry["abs"] = max(entry["abs"] or 0.0, abs(u - v))
                entry["rel"] = max(entry["rel"] or 0.0, relative(u, v))
    return fields, records_differing


def log_prob_change(left: list[dict], right: list[dict]) -> dict[tuple, float]:
    """Per evaluation (stage, step): the largest |Δ log p| of a first-token top-5 probability found in both runs."""
    change: dict[tuple, float] = {}
    for x, y in zip(left, right):
        px = {t["id"]: t["prob"] for t in x.get("top5") or []}
        py = {t["id"]: t["prob"] for t in y.get("top5") or []}
        shared = [abs(math.log(px[i]) - math.log(py[i])) for i in px.keys() & py.keys() if px[i] > 0 and py[i] > 0]
        key = (x["stage"], x["step"])
        change[key] = max(change.get(key, 0.0), *shared, 0.0)
    return change


def first_token_flips(left: list[dict], right: list[dict], reference: dict[tuple, float]) -> list[tuple]:
    """Records whose greedy first token differs: ``(where, margin, 2·reference change, within)``, the margin being
    the left run's log-probability gap between its top token and the right run's (a reordering that moves
    log-probabilities by up to Δ can swap two tokens less than 2Δ apart)."""
    flips = []
    for x, y in zip(left, right):
        if not x.get("top5") or not y.get("top5") or x["top5"][0]["id"] == y["top5"][0]["id"]:
            continue
        px = {t["id"]: t["prob"] for t in x["top5"]}
        other = px.get(y["top5"][0]["id"])
        margin = math.log(x["top5"][0]["prob"] / other) if other else math.inf
        allowed = 2 * reference.get((x["stage"], x["step"]), 0.0)
        flips.append((where(x), margin, allowed, margin <= allowed))
    return flips


def fmt(x: float | None) -> str:
    return "—" if x is None else "inf" if math.isinf(x) else f"{x:.3g}"


def print_tables(on_m: dict, ref_m: dict, on_s: dict, ref_s: dict) -> None:
    print("\n| metric | rows | on ≠ off | max abs | max rel | first differing | reordered ≠ off | its max rel |")
    print("|---|---|---|---|---|---|---|---|")
    for metric, e in sorted(on_m.items()):
        if e["differ"]:
            r = ref_m.get(metric, {"differ": 0, "rel": 0.0})
            print(
                f"| {metric}{' (d)' if discrete(metric) else ''} | {e['rows']} | {e['differ']} | {fmt(e['abs'])} | "
                f"{fmt(e['rel'])} | {e['first'][1]} | {r['differ']} | {fmt(r['rel'])} |"
            )
    print("(d): made of per-item decisions; judged item by item below, not by a relative tolerance")
    print("\n| samples.jsonl field | on ≠ off (records) | max abs | max rel | first | reordered ≠ off | its max rel |")
    print("|---|---|---|---|---|---|---|")
    for field, e in sorted(on_s.items()):
        r = ref_s.get(field, {"records": 0, "rel": None})
        print(
            f"| {field} | {e['records']} | {fmt(e['abs'])} | {fmt(e['rel'])} | {e['first']} | {r['records']} | "
            f"{fmt(r['rel'])} |"
        )


def loss_divergence(a: Path, b: Path) -> str:
    """The first logged step at which the overall training loss of ``b`` is ``LOSS_STEPS`` (relative) away from
    ``a``'s, and the largest relative difference per stage."""
    import polars as pl

    def losses(run: Path):
        frame = pl.read_parquet(run / "metrics.parquet")
        return frame.filter((pl.col("metric") == "loss") & pl.col("task").is_null())

    joined = losses(a).join(losses(b), on=["stage", "step"], suffix="_b").sort("step")
    rel = [(s, st, relative(x, y)) for s, st, x, y in joined.select("stage", "step", "value", "value_b").iter_rows()]
    firsts = [next((f"{st}" for _, st, r in rel if r >= level), "never") for level in LOSS_STEPS]
    per_stage = {s: max(r for s2, _, r in rel if s2 == s) for s, _, _ in rel}
    return (
        ", ".join(f"≥{level:g} at step {first}" for level, first in zip(LOSS_STEPS, firsts))
        + "; largest per stage: "
        + ", ".join(f"{s} {fmt(r)}" for s, r in per_stage.items())
    )


def heldout_accuracy(run: Path) -> str:
    """Held-out greedy accuracy at the last evaluation over every task and split, with its Wilson 95 % interval."""
    from bench.kernel_path_compare import heldout_greedy, values
    from harness.core.stats import wilson_interval

    correct, n = heldout_greedy(values(run))
    interval = wilson_interval(correct, n)
    return f"{correct}/{n} = {correct / n:.3f} [{interval.low:.3f}, {interval.high:.3f}]"


def judge_continuous(on_stage: dict, ref_stage: dict) -> bool:
    """Per (metric, stage) of the continuous metrics: on's largest relative difference within ``SAFETY`` (one
    step) and ``DRIFT_FACTOR`` (a run) × the reordered run's, floored; True when all are within the latter."""
    from harness.training.packing import SAFETY
    from tests.conftest import DRIFT_FACTOR, ROUNDING_FLOOR

    continuous = {k: rel for k, rel in on_stage.items() if not discrete(k[0])}
    print("\nContinuous values, per (metric, stage), on's largest relative difference against the reordered run's:")
    outside_run: list = []
    for factor, name in ((SAFETY, "SAFETY, one step"), (DRIFT_FACTOR, "DRIFT_FACTOR, a run")):
        outside = [k for k, rel in continuous.items() if rel > max(factor * ref_stage.get(k, 0.0), ROUNDING_FLOOR)]
        print(
            f"  within {factor:g}× ({name}; floor {ROUNDING_FLOOR:.3g}): {len(continuous) - len(outside)} of "
            f"{len(continuous)}"
        )
        for m, s in sorted(outside):
            print(f"    outside: {m} in {s}: {fmt(continuous[(m, s)])} against {fmt(ref_stage.get((m, s), 0.0))}")
        outside_run = outside
    stages = list(dict.fromkeys(stage for _, stage in continuous))
    for metric in HEADLINE:
        print(
            f"  {metric}, on / reordered per stage: "
            + ", ".join(
                f"{s} {fmt(on_stage.get((metric, s), 0.0))} / {fmt(ref_stage.get((metric, s), 0.0))}"
                for s in stages
                if (metric, s) in on_stage
            )
        )
    ratios = [rel / r for k, rel in continuous.items() if (r := ref_stage.get(k, 0.0)) > 0 and rel > 0]
    if ratios:
        print(
            f"  on / reordered ratio where both differ: median {statistics.median(ratios):.3g}, max "
            f"{max(ratios):.3g} ({len(ratios)} pairs)"
        )
    return not outside_run


def judge_discrete(off: list[dict], on: list[dict], ref: list[dict], on_s: dict, ref_s: dict) -> bool | None:
    """Item by item while the reordered run stays near ``off`` (every first token it flips was in off's top 5 and
    within 2Δ): True when every first token on flips is within 2Δ. None once the reordered run has itself moved
    items past their margins: then no item-level tolerance follows from it (which items flip, and how many, is one
    draw of a chaotic trajectory, not independent trials), and the counts are printed side by side."""
    change = log_prob_change(off, ref)
    flips, ref_flips = first_token_flips(off, on, change), first_token_flips(off, ref, change)
    ref_close = all(ok for *_, ok in ref_flips)
    outside = [f for f in flips if not f[3]]
    print(
        f"\nDiscrete outcomes: {len(flips)} greedy first tokens differ (reordered: {len(ref_flips)}); each one's "
        "margin in off against 2 × the reordered run's largest first-token |Δ log p| at that evaluation: "
        f"{len(flips) - len(outside)} within, {len(outside)} outside or past off's top 5 (reordered: "
        f"{sum(not ok for *_, ok in ref_flips)})"
    )
    for at, margin, allowed, ok in sorted(flips, key=lambda f: f[1] - f[2], reverse=True)[:5]:
        print(f"  {at}: margin {fmt(margin)}, 2Δ {fmt(allowed)}: {'within' if ok else 'outside'}")
    later = on_s.get("pred", {"records": 0})["records"] - len(flips)
    ref_later = ref_s.get("pred", {"records": 0})["records"] - len(ref_flips)
    print(
        f"  predictions parting after an equal first token (no margin in samples.jsonl): {later} (reordered: "
        f"{ref_later})"
    )
    if ref_close:
        return not outside
    print(
        f"  the reordered run has itself moved items past their margins: not judged item by item; records of "
        f"{len(off)} that differ from off, per field, on / reordered:"
    )
    for field in sorted(on_s.keys() | ref_s.keys()):
        a, b = on_s.get(field, {"records": 0})["records"], ref_s.get(field, {"records": 0})["records"]
        print(f"    {field}: {a} / {b}" + (f" ({a / b:.2f}×)" if b else ""))
    return None


def compare(out: Path, arms: tuple[str, str, str]) -> bool:
    """Print the comparison of ``out/<on>`` and ``out/<reordered>`` against ``out/<off>`` (``arms``: those three
    names); True when on is identical to off or within the derived tolerance everywhere."""
    off_dir, on_dir, ref_dir = (out / arm for arm in arms)
    on_m, on_stage, rows, unmatched = metric_differences(off_dir, on_dir)
    ref_m, ref_stage, _, ref_unmatched = metric_differences(off_dir, ref_dir)
    off, on, ref = (samples(d) for d in (off_dir, on_dir, ref_dir))
    if not len(off) == len(on) == len(ref):
        sys.exit(f"samples.jsonl: {len(off)}, {len(on)} and {len(ref)} records")
    (on_s, on_records), (ref_s, ref_records) = sample_differences(off, on), sample_differences(off, ref)
    differing = sum(e["differ"] for e in on_m.values())
    print(
        f"\nmetrics.parquet: {rows} rows; on ≠ off in {differing} ({unmatched} in one run only), reordered ≠ off "
        f"in {sum(e['differ'] for e in ref_m.values())} ({ref_unmatched} in one run only)"
    )
    print(f"samples.jsonl: {len(off)} records; on ≠ off in {on_records}, reordered ≠ off in {ref_records}")
    if not differing and not on_records:
        print("\nVERDICT: IDENTICAL — every metrics value and every samples.jsonl field equal with chunking on and off")
        return True
    if not any(e["differ"] for e in ref_m.values()):
        print("warning: the reordered run is bit-identical to off: it is no reference for a tolerance here")
    print(f"\ntraining loss, on against off: {loss_divergence(off_dir, on_dir)}")
    print(f"training loss, reordered against off: {loss_divergence(off_dir, ref_dir)}")
    print(
        "held-out greedy accuracy, last evaluation: "
        + "; ".join(f"{arm} {heldout_accuracy(out / arm)}" for arm in arms)
    )
    print_tables(on_m, ref_m, on_s, ref_s)
    continuous_ok = judge_continuous(on_stage, ref_stage)
    discrete_ok = judge_discrete(off, on, ref, on_s, ref_s)
    within = continuous_ok and discrete_ok is not False
    discrete_text = "not judged, the reordered run diverged" if discrete_ok is None else WORD[discrete_ok]
    print(
        f"\nVERDICT: NOT IDENTICAL; {WORD[within].upper()} the derived tolerance (continuous values: "
        f"{WORD[continuous_ok]}; discrete outcomes: {discrete_text})"
    )
    return within
