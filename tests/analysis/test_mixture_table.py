"""``harness mixture --table`` on synthetic tables with a planted law (bench/mixture_table_check.py's generator):
the planted optimum recovered, held-out mixtures ranked, ``--predict``'s intervals, and every malformed table
refused in one line naming the file, column and row (exit 2); held-out mixtures as the test of a law, for a table
and for a second sweep directory."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import polars as pl
import pytest
from scipy import stats
from typer.testing import CliRunner

from analysis.mixture_holdout import agreement
from tests.conftest import ROOT


def _bench():
    spec = importlib.util.spec_from_file_location("mixture_table_check", ROOT / "bench" / "mixture_table_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _mixture(args):
    from harness.cli.app import app

    return CliRunner().invoke(app, ["mixture", *args])


TABLE_ARGS = ["--weights", "w_*", "--objective", "mean(loss_*)", "--direction", "minimize"]
FAST_FORMS = ["--form", "constant", "--form", "scheffe", "--form", "loglinear"]


def test_a_planted_law_is_recovered_from_a_table_and_predicts_held_out_rows(tmp_path):
    bench = _bench()
    table, law, optimum = bench.planted_table(96, 48, domains=6)
    path = tmp_path / "runs.csv"
    table.write_csv(path)
    mixtures = pl.DataFrame({f"w_{d:02d}": [optimum[d], 1 / 6] for d in range(6)} | {"name": ["optimum", "uniform"]})
    mixtures.write_csv(tmp_path / "ask.csv")
    result = _mixture(
        ["--table", str(path), *TABLE_ARGS, "--holdout-column", "heldout", "--bootstrap", "30", *FAST_FORMS]
        + ["--predict", str(tmp_path / "ask.csv")]
    )
    assert result.exit_code == 0, result.output
    proposal = json.loads((tmp_path / "runs.proposal.json").read_text())
    assert proposal["source"] == "table" and proposal["n_trials"] == 96 and proposal["chosen"] == "loglinear"
    assert proposal["supported"] and proposal["holdout"]["n"] == 48
    w = np.array([proposal["mixture"][f"w_{d:02d}"] for d in range(6)])
    assert np.abs(w - optimum).sum() <= 0.05
    assert proposal["holdout"]["objective"]["rho"] >= 0.9 and proposal["holdout"]["objective"]["rho_low"] > 0
    predicted = pl.read_csv(tmp_path / "ask.predicted.csv")
    assert predicted["name"].to_list() == ["optimum", "uniform"]  # the asked mixtures' other columns are kept
    truth = law(mixtures.select(f"w_{d:02d}" for d in range(6)).to_numpy()).mean(axis=1)
    assert (predicted["low"] <= predicted["mean_low"]).all() and (predicted["mean_high"] <= predicted["high"]).all()
    assert ((predicted["low"].to_numpy() <= truth) & (truth <= predicted["high"].to_numpy())).all()
    assert predicted["predicted"][0] < predicted["predicted"][1]  # the optimum beats the uniform mixture


@pytest.mark.slow
def test_planted_law_at_17_domains_and_512_rows_within_a_minute():
    """The issue's scale (RegMix's: 17 domains, 512 runs): the planted optimum within 0.05 in L1, Spearman
    ρ >= 0.95 on 256 held-out rows, in under 60 s of CPU (every form is fitted, one thread; the wall time on a
    shared machine counts the other jobs)."""
    r = _bench().run(512, 256, 17, ["constant", "scheffe", "scheffe2", "loglinear", "gp"], 200)
    assert r["cpu_seconds"] <= 60, (r["cpu_seconds"], r["seconds"])
    assert r["chosen"] == "loglinear" and r["supported"]
    assert r["l1"] <= 0.05 and r["holdout"]["rho"] >= 0.95


def _set_cell(table: pl.DataFrame, column: str, row: int, text: str) -> pl.DataFrame:
    values = table[column].cast(pl.Utf8).to_list()
    values[row] = text
    return table.with_columns(pl.Series(column, values))


def _write(tmp_path, frame: pl.DataFrame, name: str = "t.csv"):
    path = tmp_path / name
    frame.write_csv(path) if name.endswith(".csv") else frame.write_parquet(path)
    return path


@pytest.mark.parametrize(
    "change, args, words",
    [
        (lambda t: t.drop("w_01"), ["--weights", "w_00,w_01,w_02"], ["column w_01", "no such weight column"]),
        (lambda t: _set_cell(t, "w_00", 4, "0.5"), [], ["row 5 (line 6)", "sum to", "not 1"]),
        (
            lambda t: _set_cell(t, "loss_01", 6, "n/a"),
            [],
            ["column loss_01", "row 7 (line 8)", "'n/a' is not a finite number"],
        ),
        (lambda t: t.head(3), [], ["3 rows are too few"]),
        (lambda t: t, ["--objective", "mean(acc_*)"], ["column acc_*", "no such outcome column"]),
    ],
    ids=["missing-weight", "weights-sum", "non-numeric", "too-few-rows", "missing-outcome"],
)
def test_malformed_tables_are_one_line_naming_file_column_and_row(tmp_path, change, args, words):
    table, _, _ = _bench().planted_table(24, 0, domains=3)
    path = _write(tmp_path, change(table.drop("heldout")))
    defaults = dict(zip(TABLE_ARGS[::2], TABLE_ARGS[1::2]))
    given = dict(zip(args[::2], args[1::2]))
    result = _mixture(["--table", str(path), *[x for k, v in (defaults | given).items() for x in (k, v)]])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], result.output
    for w in words:
        assert w in lines[0], lines[0]


def test_parquet_tables_and_flags_that_need_a_table(tmp_path):
    table, _, _ = _bench().planted_table(40, 0, domains=3, seed=0)
    path = _write(tmp_path, table.drop("heldout").with_columns(pl.lit(None, pl.Float64).alias("loss_02")), "t.parquet")
    result = _mixture(["--table", str(path), *TABLE_ARGS])
    assert result.exit_code == 2 and "column loss_02, row 1: empty" in result.output
    result = _mixture(["--table", str(path), "--weights", "w_*", "--objective", "loss_00"])
    assert result.exit_code == 2 and "--direction" in result.output
    result = _mixture([str(tmp_path), "--objective", "loss_00"])
    assert result.exit_code == 2 and "--table" in result.output


def test_spearman_with_bootstrap_interval_matches_scipy_with_ties():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 5, 40).astype(float)  # many ties
    b = a + rng.normal(0, 2, 40)
    r = agreement(a, b, resamples=500, seed=0)
    assert r["rho"] == pytest.approx(stats.spearmanr(a, b)[0])
    assert r["rho_low"] < r["rho"] < r["rho_high"] and r["rmse_low"] < r["rmse"] < r["rmse_high"]


def test_held_out_rho_test_holds_its_false_alarm_rate_on_noise_and_fires_on_a_ranking():
    """The gate "held-out ρ significantly positive" (bootstrap interval above 0) is a one-sided 2.5 % test: on 16
    held-out mixtures whose outcomes are noise it fires rarely (at most 10 of 200, 5 %), and on predictions that
    rank the outcomes through noise it fires nearly always."""
    alarms = hits = 0
    for rep in range(200):
        rng = np.random.default_rng(rep)
        predicted = rng.normal(size=16)
        alarms += agreement(predicted, rng.normal(size=16), resamples=500, seed=rep)["rho_low"] > 0
        hits += agreement(predicted, predicted + rng.normal(0, 0.5, 16), resamples=500, seed=rep)["rho_low"] > 0
    assert alarms <= 10 and hits >= 190, (alarms, hits)
