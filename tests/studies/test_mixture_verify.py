"""``harness mixture SWEEP_DIR --verify K``: the proposal and the sweep's winner trained on K fresh seeds (none the
sweep used, a fresh data seed too), compared on the same held-out items with the paired difference and its interval,
``verify.json`` written and its finished runs reused on a second call; the crossed seeds × items interval against
simulated tables (null coverage and a planted difference); the refusals (bad K, SLURM without submitit), one line,
exit 2.

The sweep directory is made as ``harness sweep`` makes it (the sweep file loaded, its base experiment and resolved
file written) with synthetic trials in place of trained ones: the proposal needs more trials than a test can train,
and what is verified here is the training of the two arms, not the sweep's numbers."""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml

from harness.config import ConfigError
from harness.config.yaml_io import dump_yaml
from harness.core.stats import wilson_interval
from harness.studies.mixture_steer import steering_plan
from harness.studies.mixture_verify import VERIFY_NAME, crossed_interval, used_seeds
from harness.studies.sweep import BASE_EXPERIMENT_NAME, RESOLVED_NAME, load_resolved, load_sweep
from harness.studies.sweep.load import at_full_size
from harness.studies.sweep.spec import FULL_EXPERIMENT_NAME
from harness.studies.sweep.study import prepare_study
from tests.conftest import TINY, invoke, write_yaml

TASKS = ["repeat", "yesno", "math"]
PATH = "stages.b.mixture"


def _sweep_dir(tmp_path: Path, n: int = 10, own_seed: bool = False, proxy: dict | None = None) -> tuple[Path, object]:
    exp = copy.deepcopy(TINY)
    if own_seed:  # a task that keeps its own data seed: the reports say so in a note
        exp["tasks"]["repeat"]["seed"] = 11
    exp["eval"]["every"] = 2
    for stage in exp["stages"]:
        stage["steps"] = 2
    write_yaml(tmp_path / "tiny.yaml", exp)
    source = {
        "experiment": "tiny.yaml",
        "study": {"name": "verify", "sampler": "random", "n_trials": n, "seed": 0},
        "space": {PATH: {"simplex": TASKS}},
        "objective": {"metric": "tf_first", "split": "heldout", "tasks": ["yesno", "math"], "reduce": "mean"},
        **({"proxy": proxy} if proxy else {}),
    }
    sweep = load_sweep(write_yaml(tmp_path / "verify.yaml", source))
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    (sweep_dir / BASE_EXPERIMENT_NAME).write_text(dump_yaml(sweep.base_raw))
    (sweep_dir / RESOLVED_NAME).write_text(dump_yaml(sweep.resolved_yaml()))
    if sweep.full_raw is not None:  # as harness sweep keeps it (prepare_study)
        (sweep_dir / FULL_EXPERIMENT_NAME).write_text(dump_yaml(sweep.full_raw))
    # synthetic trials: a smooth objective over the simplex, best inside it (the proposal needs a fit, not truth)
    rng = np.random.default_rng(0)
    W = rng.dirichlet(np.ones(3), size=n)
    Y = np.column_stack([0.3 + 0.6 * W[:, 1] - 0.5 * W[:, 1] ** 2, 0.2 + 0.5 * W[:, 2] - 0.6 * W[:, 2] ** 2])
    Y += rng.normal(0, 0.01, size=Y.shape)
    data = {"number": list(range(n)), "state": ["COMPLETE"] * n, "objective": Y.mean(axis=1)}
    for i, t in enumerate(TASKS):
        data[f"param/{PATH}.{t}"] = W[:, i]
    for j, t in enumerate(["yesno", "math"]):
        data[f"metric/b/heldout/{t}/tf_first"] = Y[:, j]
    data["trial_dir"] = [f"trials/{i}" for i in range(n)]
    pl.DataFrame(data).write_parquet(sweep_dir / "trials.parquet")
    return sweep_dir, sweep


VERIFY_ARGS = ["--bootstrap", "10", "--form", "constant", "--form", "scheffe2"]


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    """A synthetic sweep verified on 2 fresh seeds (its runs trained once, for the tests that read or reuse them)."""
    sweep_dir, sweep = _sweep_dir(tmp_path_factory.mktemp("verified"))
    result = invoke("mixture", str(sweep_dir), *VERIFY_ARGS, "--verify", "2")
    assert result.exit_code == 0, result.output
    return sweep_dir, sweep, result


def test_verify_trains_both_arms_on_fresh_seeds_and_reuses_them(verified):
    sweep_dir, sweep, result = verified
    args = ["mixture", str(sweep_dir), *VERIFY_ARGS]
    report = json.loads((sweep_dir / VERIFY_NAME).read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    proposal = json.loads((sweep_dir / "proposal.json").read_text())

    used = used_seeds(sweep, pl.read_parquet(sweep_dir / "trials.parquet").to_dicts())
    assert len(report["seeds"]) == 2 and not set(report["seeds"]) & used and report["data_seed"] not in used
    runs = {arm: report["arms"][arm]["runs"] for arm in ("proposal", "winner")}
    for arm, by_seed in runs.items():
        assert set(by_seed) == {str(s) for s in report["seeds"]}
        for seed, run in by_seed.items():
            assert run["how"] == "trained" and Path(run["run_dir"]) == sweep_dir / "verify" / arm / f"seed-{seed}"
            resolved = (Path(run["run_dir"]) / "config.resolved.yaml").read_text()
            assert f"seed: {seed}" in resolved and f"data_seed: {report['data_seed']}" in resolved
    # arm by arm: the winner's first stage, identical to the proposal's of the same seed, comes from the stage cache
    assert all(run["cached_steps"] > 0 for run in runs["winner"].values())
    # planned arm by arm (as run_planned orders runs that go side by side): every proposal seed before the winner's
    planned = [line.split()[0] for line in result.output.splitlines() if ": to run" in line]
    assert planned == ["proposal"] * 2 + ["winner"] * 2, planned
    assert report["arms"]["proposal"]["values"][PATH] == pytest.approx(proposal["mixture"])
    assert report["arms"]["winner"]["values"][PATH] == pytest.approx(proposal["winner"]["mixture"])

    # the same items in every run, and the paired difference is the mean of the per-seed differences
    assert report["same_items"] and report["n_items"] == 8 and report["interval"] == "seeds × items"
    diffs = [row["proposal"] - row["winner"] for row in report["per_seed"]]
    assert report["difference"]["estimate"] == pytest.approx(np.mean(diffs))
    d = report["difference"]
    assert d["low"] < d["estimate"] < d["high"]  # never zero-width, even when no item differs between the arms
    o, w = report["optimism"], report["in_sample"]
    assert w["observed"] == pytest.approx(proposal["winner"]["observed"])
    assert o["estimate"] == pytest.approx(w["observed"] - report["winner"]["mean"])  # maximize: in-sample − fresh
    assert "optimism" in result.output and "prop − win" in result.output

    again = invoke(*args, "--verify", "2")
    assert again.exit_code == 0, again.output
    second = json.loads((sweep_dir / VERIFY_NAME).read_text())
    assert all(run["how"] == "reused" for arm in second["arms"].values() for run in arm["runs"].values())
    assert second["per_seed"] == report["per_seed"]


def test_budget_curve_trains_each_budgets_mixture_on_the_verifications_seeds(tmp_path):
    sweep_dir, _ = _sweep_dir(tmp_path)
    trials = pl.read_parquet(sweep_dir / "trials.parquet")
    # trial 1 is the full sweep's winner: the budget of its first 2 trials (too few for a law over 3 weights) then
    # keeps the same mixture, which must not be trained a second time
    trials = trials.with_columns(
        pl.when(pl.col("number") == 1).then(9.0).otherwise(pl.col("objective")).alias("objective")
    )
    trials.write_parquet(sweep_dir / "trials.parquet")
    args = ["mixture", str(sweep_dir), "--bootstrap", "10", "--form", "constant", "--form", "gp"]  # gp: chosen at 6
    result = invoke(*args, "--verify", "2", "--budget", "6", "--budget", "2")
    assert result.exit_code == 0, result.output
    curve = json.loads((sweep_dir / "budget.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    report = json.loads((sweep_dir / VERIFY_NAME).read_text())
    proposal = json.loads((sweep_dir / "proposal.json").read_text())

    assert curve["seeds"] == report["seeds"] and curve["data_seed"] == report["data_seed"]
    assert [r["k"] for r in curve["rows"]] == [2, 6, "all"]
    two, six, full = curve["rows"]
    assert two["basis"] == "winner" and "too few" in two["why"] and two["arm"] == "winner"
    assert two["in_sample_winner"]["number"] == 1
    assert two["difference"]["estimate"] == 0.0  # the same runs
    assert six["basis"] == "law" and six["arm"] == "budget-6" and six["n_complete"] == 6
    assert six["in_sample_winner"]["number"] in range(6)
    assert full["arm"] == "proposal" and full["mixture"] == pytest.approx(proposal["mixture"])
    # the verification trained its two arms; the budget reused them and trained its own arm on the same seeds
    assert all(run["how"] == "trained" for arm in report["arms"].values() for run in arm["runs"].values())
    assert set(curve["runs"]) == {"proposal", "winner", "budget-6"}
    assert {run["how"] for arm in ("proposal", "winner") for run in curve["runs"][arm].values()} == {"reused"}
    assert {run["how"] for run in curve["runs"]["budget-6"].values()} == {"trained"}
    for seed in report["seeds"]:
        resolved = (sweep_dir / "verify" / "budget-6" / f"seed-{seed}" / "config.resolved.yaml").read_text()
        assert f"seed: {seed}" in resolved and f"data_seed: {report['data_seed']}" in resolved
    assert two["difference"] == {"estimate": 0.0, "low": 0.0, "high": 0.0} and two["worse"] is False
    for row in (six, full):
        d, a = row["difference"], row["adjusted"]
        assert row["mean"] - curve["winner"]["mean"] == pytest.approx(d["estimate"])
        assert a["low"] < d["low"] <= d["estimate"] <= d["high"] < a["high"]  # Bonferroni over 2 arms: wider
        assert row["worse"] == (a["high"] < 0)  # maximised: worse only when the whole adjusted interval is below 0
    # the family: the two arms compared with the winner (budget-6 and the full proposal; k=2 *is* the winner)
    assert "Bonferroni over the 2 arms" in curve["family"] and "budget curve" in result.output

    for bad in (["--budget", "3"], ["--verify", "2", "--budget", "10"], ["--verify", "2", "--budget", "0"]):
        refused = invoke("mixture", str(sweep_dir), *bad)
        assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1, refused.output
        assert "--budget" in refused.output


def test_a_proposal_that_is_the_winners_mixture_is_trained_once(tmp_path):
    sweep_dir, _ = _sweep_dir(tmp_path)
    trials = pl.read_parquet(sweep_dir / "trials.parquet")
    noise = np.random.default_rng(5).normal(0.5, 0.1, size=(len(trials), 2))  # no law: the mean wins
    columns = [c for c in trials.columns if c.startswith("metric/")]
    trials = trials.with_columns([pl.Series(c, noise[:, j]) for j, c in enumerate(columns)])
    trials.with_columns(pl.Series("objective", noise.mean(axis=1))).write_parquet(sweep_dir / "trials.parquet")
    result = invoke(
        "mixture", str(sweep_dir), "--bootstrap", "10", "--form", "constant", "--form", "scheffe", "--verify", "1"
    )
    assert result.exit_code == 0, result.output
    report = json.loads((sweep_dir / VERIFY_NAME).read_text())
    assert json.loads((sweep_dir / "proposal.json").read_text())["chosen"] == "constant"
    assert not (sweep_dir / "verify" / "proposal").exists()  # nothing trained twice
    runs = {arm: report["arms"][arm]["runs"] for arm in ("proposal", "winner")}
    assert runs["proposal"] == runs["winner"] and report["difference"]["estimate"] == 0.0
    assert any("stand for both arms" in n for n in report["notes"])


def test_a_budget_counts_pruned_trials_and_may_leave_nothing_to_train(tmp_path):
    from analysis.loading import read_sweep_config
    from analysis.mixture_proposal import budget_choice

    sweep_dir, _ = _sweep_dir(tmp_path)
    trials = pl.read_parquet(sweep_dir / "trials.parquet")
    trials = trials.with_columns(pl.when(pl.col("number") < 2).then(pl.lit("PRUNED")).otherwise("state").alias("state"))
    config = read_sweep_config(sweep_dir)
    nothing = budget_choice(trials, config, 2)  # the first two trials were both pruned
    assert nothing["basis"] == "none" and nothing["mixture"] is None and nothing["n_complete"] == 0
    one = budget_choice(trials, config, 3)  # one complete trial: too few for a law, so it is the mixture to train
    assert one["basis"] == "winner" and one["winner"]["number"] == 2 and one["n_complete"] == 1
    assert one["mixture"] == pytest.approx({t: trials[f"param/{PATH}.{t}"][2] for t in TASKS})


def test_a_budget_row_is_worse_only_when_its_adjusted_interval_is_on_the_worse_side():
    from harness.studies.mixture_budget import _compared
    from harness.studies.mixture_verify import ArmScores

    row = {"k": 4, "basis": "law", "why": "scheffe", "n_complete": 4, "mixture": {}, "winner": None}
    winner = ArmScores([0.50, 0.52, 0.51], None, None)
    lower = ArmScores([0.30, 0.33, 0.31], None, None)  # 0.2 below the winner on every seed, little spread
    scores = {"winner": winner, "budget-4": lower}
    worse_max = _compared(row, "budget-4", scores, False, 1 - 0.05 / 3, maximize=True)
    assert worse_max["worse"] is True and worse_max["adjusted"]["high"] < 0
    # minimised (a loss): the same numbers are a gain, never worse
    assert _compared(row, "budget-4", scores, False, 1 - 0.05 / 3, maximize=False)["worse"] is False
    noisy = ArmScores([0.20, 0.70, 0.45], None, None)  # the same mean shift hidden in seed noise
    assert _compared(row, "budget-4", {**scores, "budget-4": noisy}, False, 0.99, maximize=True)["worse"] is False
    nothing = _compared({**row, "mixture": None}, None, scores, False, 0.99, maximize=True)
    assert nothing["worse"] is None and nothing["values"] == [] and nothing["difference"]["estimate"] is None


def _finished_runs(sweep_dir: Path, plan, items: int = 4) -> dict[str, str]:
    """Finished runs as the runner leaves them, for what the reports read: each (arm, seed)'s ``summary.json``
    (stage b's held-out tf_first per task) and the 0/1 outcomes of the same items in ``samples.jsonl``."""
    rng = np.random.default_rng(7)
    for arm, seed, _ in plan:
        out = sweep_dir / "verify" / arm / f"seed-{seed}"
        out.mkdir(parents=True, exist_ok=True)
        records, metrics = [], {}
        for task in ("yesno", "math"):
            outcomes = (rng.random(items) < 0.6).astype(int)
            metrics[task] = {"tf_first": float(outcomes.mean())}
            where = {"stage": "b", "step": 4, "task": task, "split": "heldout", "gold": "x"}
            records += [
                {**where, "index": i, "prompt": f"{task} {i}", "outcomes": {"tf_first": int(o)}}
                for i, o in enumerate(outcomes)
            ]
        (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (out / "summary.json").write_text(json.dumps({"stages": [{"name": "b", "metrics": {"heldout": metrics}}]}))
    return {f"{arm} seed {seed}": "reused" for arm, seed, _ in plan}


def test_budget_steer_and_verify_give_one_comparison_the_same_interval(tmp_path, monkeypatch):
    """The verification, the budget curve and the steering report read the same runs: the full proposal against
    the winner is one comparison, with one interval, whatever notes each report carries (a task that keeps its
    own seed, a steering method that raises the worst task of a mean objective)."""
    from harness.studies import mixture_budget, mixture_steer, mixture_verify

    sweep_dir, sweep = _sweep_dir(tmp_path, own_seed=True)
    trials = pl.read_parquet(sweep_dir / "trials.parquet").to_dicts()
    winner = {"number": 0, "observed": trials[0]["objective"], "mixture": None}
    proposal = {"path": PATH, "mixture": {"repeat": 0.2, "yesno": 0.5, "math": 0.3}, "winner": winner}
    for module in (mixture_verify, mixture_budget, mixture_steer):  # the runs are there: nothing to train
        monkeypatch.setattr(module, "run_arms", lambda _s, d, plan, *_a, **_k: (True, _finished_runs(d, plan)))

    checked = mixture_verify.verify(sweep, sweep_dir, proposal, trials, 3)
    row = {"k": "all", "basis": "law", "why": "scheffe", "n_complete": len(trials), **proposal}
    curve = mixture_budget.verify_budget(sweep, sweep_dir, proposal, [row], trials, 3)
    plan = mixture_steer.steering_plan(sweep, proposal, trials, ["groupdro"], 3)
    steered = mixture_steer.verify_steering(sweep, sweep_dir, proposal, plan, trials)

    assert any("keep their own seed" in n for n in checked["notes"] + curve["notes"])
    assert checked["interval"] == curve["interval"] == steered["interval"] == "seeds × items"
    (full,) = curve["rows"]
    assert full["arm"] == "proposal"
    assert full["difference"] == pytest.approx(checked["difference"])
    assert curve["winner"]["values"] == [r["winner"] for r in checked["per_seed"]]


def test_the_worse_verdict_holds_its_level_on_a_null_and_finds_a_planted_drop_at_three_seeds():
    """The budget curve's verdict at the shipped regime (3 seeds, t over seeds, Bonferroni over 3 arms): under no
    difference it fires at most at its one-sided level 0.025/3 ≈ 0.0083; a drop of 0.2 with seed-to-seed noise of
    0.03 per arm is found most of the time (measured 0.009 and 0.67 on 4,000 draws each)."""
    from harness.studies.mixture_budget import _compared
    from harness.studies.mixture_verify import ArmScores

    rng = np.random.default_rng(0)
    row = {"k": 4, "basis": "law", "why": "", "n_complete": 4, "mixture": {}, "winner": None}

    def alarms(shift: float, draws: int = 1500) -> int:
        fired = 0
        for _ in range(draws):
            level = rng.normal(0.4, 0.05, 3)  # each seed's level, shared by both arms (paired)
            winner, budget = level + rng.normal(0, 0.03, 3), level + shift + rng.normal(0, 0.03, 3)
            scores = {"winner": ArmScores(list(winner), None, None), "b": ArmScores(list(budget), None, None)}
            fired += _compared(row, "b", scores, False, 1 - 0.05 / 3, maximize=True)["worse"]
        return fired

    null = alarms(0.0)
    assert wilson_interval(null, 1500).low <= 0.025 / 3, null  # no more often than its level
    planted = alarms(-0.2)
    assert wilson_interval(planted, 1500).low > 0.5, planted


def test_verify_refuses_bad_k_and_slurm_without_submitit(tmp_path, monkeypatch):
    sweep_dir, _ = _sweep_dir(tmp_path)
    result = invoke("mixture", str(sweep_dir), "--verify", "0")
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "--verify 0" in result.output
    monkeypatch.setitem(sys.modules, "submitit", None)  # import submitit now fails
    result = invoke("mixture", str(sweep_dir), "--verify", "2", "--launcher", "slurm")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        '--launcher slurm needs submitit, the harness\'s cluster extra: pip install -e ".[cluster]"'
    )
    assert not (sweep_dir / "verify").exists()  # refused before anything ran


def test_another_objective_is_read_from_the_trials_and_written_apart(tmp_path, monkeypatch):
    """``--set objective.…``: the law, the winner and the verification use the new objective, reduced from the
    trials' own columns (not the recorded objective, the sweep's), and write into their own folder; the sweep's
    own proposal is not touched. Anything but the objective, or an objective the experiment cannot give, is refused
    in one line (exit 2)."""
    sweep_dir, _ = _sweep_dir(tmp_path)
    trials = pl.read_parquet(sweep_dir / "trials.parquet")
    W = trials.select([f"param/{PATH}.{t}" for t in TASKS]).to_numpy()
    losses = {"yesno": 1.0 + (W[:, 0] - 0.6) ** 2, "math": 1.2 + 0.5 * (W[:, 0] - 0.6) ** 2}  # best near repeat 0.6
    trials = trials.with_columns(pl.Series(f"metric/b/heldout/{t}/eval_loss", v) for t, v in losses.items())
    trials.write_parquet(sweep_dir / "trials.parquet")
    retarget = ["--set", "objective.metric=eval_loss"]
    seen = {}

    def fake_verify(sweep, folder, proposal, trials, k, launcher=None, echo=print):
        seen.update(objective=sweep.objectives[0].to_yaml(), folder=folder, winner=proposal["winner"]["number"])
        return None  # as a launcher that left the runs going

    monkeypatch.setattr("harness.studies.mixture_verify.verify", fake_verify)
    result = invoke("mixture", str(sweep_dir), *VERIFY_ARGS, *retarget, "--verify", "2")
    assert result.exit_code == 0, result.output
    folder = seen["folder"]
    assert folder.parent == sweep_dir and folder.name.startswith("objective-eval_loss-heldout-")
    assert seen["objective"]["metric"] == "eval_loss" and seen["objective"]["direction"] == "minimize"
    proposal = json.loads((folder / "proposal.json").read_text())
    mean_loss = (losses["yesno"] + losses["math"]) / 2
    assert seen["winner"] == proposal["winner"]["number"] == int(np.argmin(mean_loss))
    assert proposal["winner"]["observed"] == pytest.approx(mean_loss.min())
    assert int(np.argmin(mean_loss)) != int(np.argmax(trials["objective"].to_numpy()))  # not the recorded winner
    assert not (sweep_dir / "proposal.json").exists()
    # a held-out sweep of the same space is scored by the new objective too, not by its own recorded one
    held = tmp_path / "held"
    held.mkdir()
    held_dir, _ = _sweep_dir(held)
    trials.write_parquet(held_dir / "trials.parquet")
    result = invoke("mixture", str(sweep_dir), *VERIFY_ARGS, *retarget, "--holdout", str(held_dir))
    assert result.exit_code == 0, result.output
    rows = json.loads((folder / "proposal.json").read_text())["holdout"]["rows"]
    assert [r["observed"] for r in rows] == pytest.approx(list(mean_loss))

    for args, words in [
        (["--set", "study.n_trials=3"], "--set study.n_trials=3: only objective.<key>=<value>"),
        (["--set", "objective.metric=no_such_metric"], "objective.metric"),
        ([*retarget, "--table", str(sweep_dir / "trials.parquet")], "not with --table"),
    ]:
        refused = invoke("mixture", *([] if "--table" in args else [str(sweep_dir)]), *args)
        assert refused.exit_code == 2 and words in refused.output, refused.output
        assert len(refused.output.strip().splitlines()) == 1, refused.output


def test_a_proxy_sweeps_verification_at_full_size_trains_the_experiment_without_its_proxy(tmp_path, monkeypatch):
    """``--verify K --full-size``: a proxy sweep keeps its base without the proxy (experiment.full.yaml, written as
    the study is prepared), and the verification's arms are made from it, into their own folder; refused without
    --verify, on a sweep with no proxy, and on a proxy sweep that kept no full-size base."""
    sweep_dir, sweep = _sweep_dir(tmp_path, proxy={"stages.a.steps": 1})
    assert sweep.base_raw["stages"][0]["steps"] == 1 and sweep.full_raw["stages"][0]["steps"] == 2
    prepare_study(sweep, tmp_path / "prepared")
    assert (tmp_path / "prepared" / FULL_EXPERIMENT_NAME).read_text() == dump_yaml(sweep.full_raw)
    assert load_resolved(sweep_dir).full_raw == sweep.full_raw  # read back from the sweep directory
    seen = {}

    def fake_verify(sweep, folder, proposal, trials, k, launcher=None, echo=print):
        seen.update(steps=[s["steps"] for s in sweep.base_raw["stages"]], folder=folder, full=sweep.full_size)
        return None

    monkeypatch.setattr("harness.studies.mixture_verify.verify", fake_verify)
    result = invoke("mixture", str(sweep_dir), *VERIFY_ARGS, "--verify", "2", "--full-size")
    assert result.exit_code == 0, result.output
    assert seen == {"steps": [2, 2], "folder": sweep_dir / "full-size", "full": True}

    (tmp_path / "plain").mkdir()
    no_proxy, _ = _sweep_dir(tmp_path / "plain")
    # an objective the proxy made possible (the loss pool) that the full-size experiment cannot give: refused
    source = yaml.safe_load((tmp_path / "verify.yaml").read_text())
    source |= {"proxy": {"eval.loss_items": 8}, "objective": {"metric": "eval_loss", "split": "loss_heldout"}}
    pooled = load_sweep(write_yaml(tmp_path / "pooled.yaml", source))
    with pytest.raises(ConfigError, match="objective.split"):
        at_full_size(pooled)
    (sweep_dir / FULL_EXPERIMENT_NAME).unlink()
    for directory, args, words in [
        (sweep_dir, [], "--full-size trains the verification's arms: it needs --verify K"),
        (no_proxy, ["--verify", "2"], "the sweep has no proxy: its trials are full size"),
        (sweep_dir, ["--verify", "2"], f"no {FULL_EXPERIMENT_NAME} in the sweep directory"),
    ]:
        refused = invoke("mixture", str(directory), *VERIFY_ARGS, "--full-size", *args)
        assert refused.exit_code == 2 and words in refused.output, refused.output
        assert len(refused.output.strip().splitlines()) == 1


def _tables(rng, seeds: int, items: int, effect: float) -> np.ndarray:
    """Paired 0/1 outcomes of two arms on the same items, differenced: item difficulty shared by both arms and all
    seeds, a per-seed shift, and ``effect`` added to the first arm's success probability."""
    difficulty = rng.normal(0, 1.0, size=items)
    seed_shift = rng.normal(0, 0.3, size=(seeds, 1))
    logit = difficulty[None, :] + seed_shift
    p_b = 1 / (1 + np.exp(-logit))
    p_a = np.clip(p_b + effect, 0, 1)
    return (rng.random((seeds, items)) < p_a).astype(float) - (rng.random((seeds, items)) < p_b).astype(float)


def test_crossed_interval_covers_a_null_and_finds_a_planted_difference():
    rng = np.random.default_rng(1)
    sims = 300
    # null: no difference between the arms; the interval should cover 0 about 95 % of the time
    covered = sum(lo <= 0 <= hi for _, lo, hi in (crossed_interval(_tables(rng, 3, 40, 0.0)) for _ in range(sims)))
    ci = wilson_interval(covered, sims)
    assert ci.high >= 0.95 and ci.low >= 0.85, (covered, sims)
    # planted: the first arm is 0.25 more likely right on every item; the interval should exclude 0 mostly
    hits = sum(lo > 0 for _, lo, _ in (crossed_interval(_tables(rng, 3, 40, 0.25)) for _ in range(sims)))
    assert wilson_interval(hits, sims).low > 0.5, (hits, sims)
    assert np.isnan(crossed_interval(np.ones((1, 5)))[1])  # one seed: no interval


def test_a_seed_groups_replicate_seeds_count_as_used():
    from types import SimpleNamespace

    from harness.config import validate_data

    spec = copy.deepcopy(TINY)
    spec["seeds"] = [0, 1005]  # run --seeds: replicates the sweep's base may have been run with
    used = used_seeds(SimpleNamespace(base=validate_data(spec, "tiny")), [])
    assert 1005 in used  # else fresh seeds max(used) + 1000 + i could reuse it


def test_steering_is_trained_on_the_verifications_seeds_and_compared_with_the_winner(verified):
    """--steer groupdro: one arm, the winner's mixture replaced by groupdro over the same tasks from the uniform
    start, steering by the objective's metric on a split imitating the objective's; trained on the verification's
    seeds (the winner's runs reused) with its start held fixed, and compared with both, paired, in steer.json."""
    sweep_dir, sweep, _ = verified
    args = ["mixture", str(sweep_dir), *VERIFY_ARGS, "--verify", "2"]
    result = invoke(*args, "--steer", "groupdro")
    assert result.exit_code == 0, result.output
    report = json.loads((sweep_dir / "steer.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    (row,) = report["rows"]
    assert (
        row["arm"] == "steer-groupdro" and report["seeds"] == json.loads((sweep_dir / VERIFY_NAME).read_text())["seeds"]
    )
    adaptive = row["mixture"]["adaptive"]
    assert adaptive["start"] == {t: pytest.approx(1 / 3) for t in TASKS} and adaptive["signal"] == "steering_error"
    assert adaptive["steering"] == {"split": "heldout", "metric": "tf_first"}  # the objective's
    assert {run["how"] for run in report["runs"]["winner"].values()} == {"reused"}
    assert {run["how"] for run in report["runs"]["steer-groupdro"].values()} == {"trained"}
    steered = sweep_dir / "verify" / "steer-groupdro" / f"seed-{report['seeds'][0]}"
    assert "method: groupdro" in (steered / "config.resolved.yaml").read_text()
    measured = pl.read_parquet(steered / "metrics.parquet").filter(pl.col("metric") == "steering_error")
    assert sorted(measured["task"].to_list()) == sorted(TASKS)  # it steered (every: auto → one update of two steps)
    # what groupdro optimises is said next to what the objective is
    assert any("as a min objective asks; this objective is a mean" in n for n in report["notes"])
    # against the winner and against its own start held fixed (the uniform mixture, trained on the same seeds)
    assert {run["how"] for run in report["runs"]["start-uniform"].values()} == {"trained"}
    start = sweep_dir / "verify" / "start-uniform" / f"seed-{report['seeds'][0]}" / "config.resolved.yaml"
    assert "adaptive" not in start.read_text()
    for key, mean in (("vs_winner", report["winner"]["mean"]), ("vs_start", report["start"]["mean"])):
        d = row[key]
        assert d["estimate"] == pytest.approx(row["mean"] - mean) and d["low"] <= d["high"]
        assert d["adjusted"]["low"] <= d["low"] and d["high"] <= d["adjusted"]["high"]  # Bonferroni over 2: wider
    assert "Bonferroni over 2 comparisons" in report["family"] and "steer-groupdro" in result.output

    # refused before anything trains: an objective a steering split cannot measure, or a minimised one
    proposal = json.loads((sweep_dir / "proposal.json").read_text())
    trials = pl.read_parquet(sweep_dir / "trials.parquet").to_dicts()
    objective = sweep.objectives[0]
    for change, words in (({"metric": "mode_ok"}, "cannot be measured"), ({"direction": "minimize"}, "minimised")):
        sweep.objectives[0] = dataclasses.replace(objective, **change)
        with pytest.raises(ValueError, match=words):
            steering_plan(sweep, proposal, trials, ["groupdro"], 2)
    sweep.objectives[0] = objective
    for bad, words in (
        (["--steer", "groupdro"], "needs --verify"),
        ([*args[2:], "--steer", "grupdro"], "did you mean"),
    ):
        refused = invoke("mixture", str(sweep_dir), *bad)
        assert refused.exit_code == 2 and words in refused.output, refused.output
