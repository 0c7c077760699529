"""Compare runs of one experiment made on different CPU kernel paths (``bench/kernel_path.sh``, docs/kernel_paths.md):
which are bitwise the same run, and how far the others moved.

    python bench/kernel_path_compare.py RUN_DIR [RUN_DIR ...]

The first run directory is the reference. Per run: the pretraining's final loss and the last training loss (full
precision), the stored values that differ from the reference's (every metric but ``tokens_per_s``, matched on
stage, step, task, split, metric and text), the greedy predictions in ``samples.jsonl`` that differ, and held-out
greedy accuracy at the last evaluation over every task and split, with its Wilson 95 % interval. Then the runs
grouped by bitwise identity (every stored value and every prediction the same).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl

from harness.core.stats import wilson_interval

KEY = ["stage", "step", "task", "split", "metric", "text"]
TIMING = ("tokens_per_s",)


def values(run: Path) -> pl.DataFrame:
    frame = pl.read_parquet(run / "metrics.parquet").filter(~pl.col("metric").is_in(TIMING))
    return frame.select([*KEY, "value", "n"]).sort(KEY, nulls_last=True)


def predictions(run: Path) -> list[tuple]:
    lines = (run / "samples.jsonl").read_text().splitlines()
    return [(s["stage"], s["step"], s["task"], s["split"], s["index"], s["pred"]) for s in map(json.loads, lines)]


def heldout_greedy(frame: pl.DataFrame) -> tuple[int, int]:
    """(correct, n) of greedy accuracy at the last evaluation, summed over tasks and held-out splits."""
    rows = frame.filter(
        (pl.col("metric") == "greedy")
        & pl.col("task").is_not_null()
        & pl.col("text").is_null()
        & pl.col("split").is_in(["heldout", "heldout_template"])
    )
    rows = rows.filter(pl.col("step") == rows["step"].max())
    return int(round(sum(v * n for v, n in zip(rows["value"], rows["n"])))), int(rows["n"].sum())


def main(runs: list[Path]) -> None:
    reference, reference_predictions = values(runs[0]), predictions(runs[0])
    print(
        "| run | pretraining final loss | last training loss | values differing | predictions differing "
        "| held-out greedy, last evaluation |"
    )
    print("|---|---|---|---|---|---|")
    groups: dict[tuple, list[str]] = {}
    for run in runs:
        frame, preds = values(run), predictions(run)
        joined = reference.join(frame, on=KEY, how="inner", suffix="_run", nulls_equal=True)
        differing = joined.filter(pl.col("value").ne_missing(pl.col("value_run")))
        losses = frame.filter(pl.col("task").is_null() & (pl.col("metric") == "loss")).sort("step")
        pretrain = json.loads((run / "summary.json").read_text())["base"].get("pretrain_final_loss")
        correct, n = heldout_greedy(frame)
        interval = wilson_interval(correct, n)
        changed = sum(a != b for a, b in zip(reference_predictions, preds))
        print(
            f"| {run.name} | {pretrain!r} | {losses['value'][-1]!r} | {len(differing)} / {len(joined)} | "
            f"{changed} / {len(preds)} | {correct}/{n} = {correct / n:.3f} [{interval.low:.3f}, {interval.high:.3f}] |"
        )
        groups.setdefault((tuple(frame["value"].to_list()), tuple(preds)), []).append(run.name)
    print()
    for members in groups.values():
        print("bitwise the same run:", ", ".join(members))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__.split("\n\n")[1].strip())
    main([Path(p) for p in sys.argv[1:]])
