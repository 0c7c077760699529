"""The SNR of a target and the loss → greedy link (analysis/mixture_snr.py),: synthetic sweeps, planted effects."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from scipy import special

from analysis.mixture_snr import fit_link, format_snr_table, route_errors, route_table, snr, snr_table
from harness.core.metrics import GROUP_FILE
from tests.conftest import invoke


def test_snr_is_large_when_mixtures_matter_and_near_one_on_a_null():
    rng = np.random.default_rng(0)
    w = rng.uniform(0, 1, 32)
    planted = snr(2.0 - 1.0 * w + rng.normal(0, 0.02, 32), rng.normal(1.5, 0.02, 5))
    assert planted.ratio > 5 and planted.low > 2 and planted.n_mixtures == 32 and planted.n_seeds == 5
    draws = [(rng.normal(0, 0.05, 32), rng.normal(0, 0.05, 5)) for _ in range(200)]
    nulls = [snr(m, s) for m, s in draws]
    assert 0.8 < np.median([r.ratio for r in nulls]) < 1.3
    held = sum(r.low <= 1 <= r.high for r in nulls)
    assert 180 <= held  # the F interval holds the true ratio 1 in ~95 % of null draws (Binomial(200, .95): 1st pct 183)
    boot = [snr(m, s, resamples=300, seed=i, interval="bootstrap") for i, (m, s) in enumerate(draws[:60])]
    assert sum(r.low <= 1 <= r.high for r in boot) < 50  # the percentile bootstrap is too narrow at 5 seeds
    assert np.isnan(snr([1.0, 2.0], [1.0]).ratio)  # one seed: no noise estimate


def test_the_link_recovers_a_planted_logistic():
    rng = np.random.default_rng(1)
    loss = rng.uniform(0.5, 3.0, 40)
    rate = special.expit(4.0 - 2.5 * loss) + rng.normal(0, 0.01, 40)
    link = fit_link(loss, rate)
    assert link.a == pytest.approx(4.0, abs=0.4) and link.b == pytest.approx(-2.5, abs=0.3)
    assert np.all(np.diff(link(np.linspace(0, 4, 9))) < 0)  # monotone, decreasing in the loss
    with pytest.raises(ValueError, match="three or more"):
        fit_link([1.0, 1.0, 1.0], [0.2, 0.3, 0.4])


def test_the_loss_route_beats_the_direct_route_when_the_rate_is_the_noisier_target():
    """Planted: loss = log-linear in the mixture with little noise; the greedy rate = a logistic of the loss plus
    binomial noise of 64 items. Fitted through the loss and the link, the rate is predicted better held-out."""
    rng = np.random.default_rng(2)
    W = rng.dirichlet(np.ones(3), 32)
    loss = 1.0 + 0.8 * np.exp(-2.0 * W[:, 0] + 0.5 * W[:, 1]) + rng.normal(0, 0.01, 32)
    rate = rng.binomial(64, special.expit(6.0 - 4.0 * loss)) / 64
    errors = route_errors(W, loss, rate, form="scheffe2")
    assert errors.folds == "leave-one-trial-out" and errors.n == 32
    assert errors.via_loss < errors.direct


def _write_run(run_dir, metrics):
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"stages": [{"name": "b", "metrics": metrics}]}))
    samples = [
        {"stage": "b", "step": 8, "task": t, "split": s, "index": i}
        for s in metrics
        for t in metrics[s]
        for i in range(7)
    ]
    (run_dir / "samples.jsonl").write_text("\n".join(json.dumps(x) for x in samples) + "\n")


def _sweep_and_group(tmp_path, n=16, seeds=4):
    """A sweep's trials over a two-task simplex (the loss moves with the mixture, the greedy rate does not) and a
    seed group of one mixture."""
    rng = np.random.default_rng(3)
    w = rng.uniform(0, 1, n)
    trials = pl.DataFrame(
        {
            "number": range(n),
            "state": ["COMPLETE"] * n,
            "param/stages.b.mixture.qa": w,
            "param/stages.b.mixture.yesno": 1 - w,
            "metric/b/heldout/qa/greedy": rng.binomial(64, 0.3, n) / 64,
            "metric/b/loss_heldout/qa/eval_loss": 2.0 - w + rng.normal(0, 0.01, n),
            "metric/b/loss_heldout/qa/gold_logprob": -6.0 + 3 * w + rng.normal(0, 0.03, n),
        }
    )
    group = tmp_path / "group"
    group.mkdir()
    (group / GROUP_FILE).write_text(json.dumps({"replicates": {str(s): f"seed-{s}" for s in range(seeds)}}))
    for s in range(seeds):
        loss = {"eval_loss": 1.5 + rng.normal(0, 0.01), "gold_logprob": -4.5 + rng.normal(0, 0.03)}
        _write_run(
            group / f"seed-{s}",
            {"heldout": {"qa": {"greedy": rng.binomial(64, 0.3) / 64}}, "loss_heldout": {"qa": loss}},
        )
    return trials, group


def test_the_table_reads_a_sweep_and_a_seed_group(tmp_path):
    trials, group = _sweep_and_group(tmp_path)
    table = snr_table(trials, group)
    by = {r["metric"]: r for r in table.iter_rows(named=True)}
    assert by["eval_loss"]["split"] == "loss_heldout" and by["greedy"]["split"] == "heldout"
    assert by["eval_loss"]["low"] > 2 and by["gold_logprob"]["low"] > 2 and by["greedy"]["low"] < 1  # 1: no signal
    assert by["eval_loss"]["trials"] == 16 and by["eval_loss"]["seeds"] == 4 and by["eval_loss"]["items"] == 7
    assert "eval_loss" in format_snr_table(table) and "seeds 4" in format_snr_table(table)
    routes = route_table(trials, form="scheffe")
    assert routes["task"].to_list() == ["qa"] and routes["loss_split"][0] == "loss_heldout"


def test_harness_mixture_snr_prints_both_tables(tmp_path):
    trials, group = _sweep_and_group(tmp_path)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    trials.write_parquet(sweep / "trials.parquet")
    result = invoke("mixture", str(sweep), "--snr", str(group), "--form", "scheffe")
    assert result.exit_code == 0, result.output
    assert "sd across mixtures / sd across seeds" in result.output and "then the link" in result.output
    assert "qa" in result.output and "scheffe, leave-one-trial-out, n 16" in result.output
    refused = invoke("mixture", str(sweep), "--snr", str(tmp_path / "nothing"))
    assert refused.exit_code == 2
