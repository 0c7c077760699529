"""bench/kernel_path_compare.py (docs/kernel_paths.md): runs whose stored values and predictions are the same in
every bit are grouped as one run; a run differing in one bit of one value, or in one prediction, is a run of its
own and its differences are counted."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import sys
from pathlib import Path

import polars as pl

from tests.conftest import ROOT


def _bench():
    spec = importlib.util.spec_from_file_location("kernel_path_compare", ROOT / "bench" / "kernel_path_compare.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _run(where: Path, loss: float, pred: str = "4") -> Path:
    """A run directory with what the script reads: two training losses, one held-out evaluation, one sample."""
    where.mkdir(parents=True)
    rows = [
        ("a", 1, None, None, "loss", 2.5, None, None),
        ("a", 2, None, None, "loss", loss, None, None),
        ("a", 2, "math", "heldout", "greedy", 0.75, None, 4),
        ("a", 2, None, None, "tokens_per_s", float(len(str(where))), None, None),  # timing: never compared
    ]
    columns = ["stage", "step", "task", "split", "metric", "value", "text", "n"]
    pl.DataFrame(rows, schema=columns, orient="row").write_parquet(where / "metrics.parquet")
    sample = {"stage": "a", "step": 2, "task": "math", "split": "heldout", "index": 0, "pred": pred}
    (where / "samples.jsonl").write_text(json.dumps(sample) + "\n")
    (where / "summary.json").write_text(json.dumps({"base": {"pretrain_final_loss": 3.0}}))
    return where


def test_bitwise_equal_runs_group_and_one_bit_or_one_answer_splits_them(tmp_path, capsys):
    native = _run(tmp_path / "native", 1.25)
    again = tmp_path / "again"
    shutil.copytree(native, again)
    one_bit = _run(tmp_path / "one_bit", math.nextafter(1.25, 2.0))  # the last bit only
    answer = _run(tmp_path / "answer", 1.25, pred="5")
    _bench().main([native, again, one_bit, answer])
    out = capsys.readouterr().out
    assert "bitwise the same run: native, again\n" in out
    assert "bitwise the same run: one_bit\n" in out and "bitwise the same run: answer\n" in out
    one_bit_row = next(line for line in out.splitlines() if line.startswith("| one_bit"))
    assert "| 1 / 3 | 0 / 1 |" in one_bit_row  # the second loss, of the three values matched (timing left out)
    assert "| 0 / 3 | 1 / 1 |" in next(line for line in out.splitlines() if line.startswith("| answer"))
    assert "3/4 = 0.750 [" in one_bit_row  # held-out greedy with its Wilson interval
