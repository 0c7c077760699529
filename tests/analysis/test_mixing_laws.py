"""Mixing laws and the proposal against synthetic sweeps drawn from a known law (no training: fast): the log-linear
law's parameters recovered, the cross-validated choice picking the generating form, the proposal inside the convex
hull and better than the best explored trial under the truth, the bootstrap interval covering the truth, and the
``harness mixture`` command on a tiny fake sweep directory."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from scipy import optimize
from typer.testing import CliRunner

from analysis import mixing_laws as laws
from analysis.loading import AnalysisError
from analysis.mixture_proposal import PROPOSAL_NAME, propose, search_hull

TASKS = ["yesno", "assistant_qa", "repeat"]
PATH = "stages[1].mixture"
# A log-linear law per target task (Ye et al.): L = C + K·exp(T @ w); rows of T: targets. Loss-like: lower is
# better, each task's loss falls with its own weight and rises with the others', so the mean over the three
# targets is best at an interior mixture (about 0.39, 0.26, 0.35).
C = np.array([0.5, 0.8, 0.3])
K = np.array([1.0, 0.6, 0.8])
T = np.array([[-3.0, 1.0, 0.5], [0.5, -2.5, 1.0], [1.0, 0.5, -2.0]])
# A Scheffé quadratic per target (rows: w_1..w_3, then w1w2, w1w3, w2w3).
QUAD = np.array(
    [[1.0, 0.2, 0.4], [0.3, 1.1, 0.2], [0.6, 0.5, 1.0], [-2.5, 1.5, 0.3], [1.2, -2.0, -1.0], [0.8, 0.9, -2.2]]
)


def loglinear_truth(W: np.ndarray) -> np.ndarray:
    return C + K * np.exp(W @ T.T)


def quadratic_truth(W: np.ndarray) -> np.ndarray:
    w1, w2, w3 = W.T
    return np.column_stack([W, w1 * w2, w1 * w3, w2 * w3]) @ QUAD


def sweep_frame(
    W: np.ndarray, Y: np.ndarray, metric: str = "eval_loss", seeds: np.ndarray | None = None, reduce=np.mean
) -> pl.DataFrame:
    """Trials in the sweep's schema: the weights of ``PATH``, the targets ``Y`` as the final ``metric`` of each
    task at the end of stage ``mix`` on heldout, the objective reduced from them; one FAIL trial."""
    n = len(W)
    data: dict = {"number": list(range(n)), "state": ["COMPLETE"] * n, "objective": reduce(Y, axis=1)}
    for i, t in enumerate(TASKS):
        data[f"param/{PATH}.{t}"] = W[:, i]
    if seeds is not None:
        data["param/seed"] = seeds
    for j, t in enumerate(TASKS):
        data[f"metric/mix/heldout/{t}/{metric}"] = Y[:, j]
    data["trial_dir"] = [f"trials/{i:04d}" for i in range(n)]
    trials = pl.DataFrame(data)
    failed = pl.DataFrame({"number": [n], "state": ["FAIL"]})
    return pl.concat([trials, failed], how="diagonal_relaxed")


def sweep_config(metric: str = "eval_loss", reduce: str = "mean") -> dict:
    return {
        "space": {PATH: {"simplex": TASKS}},
        "objective": {"metric": metric, "split": "heldout", "tasks": TASKS, "reduce": reduce},
    }


def draw(law, n: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    W = rng.dirichlet(np.ones(3), size=n)
    return W, law(W) + rng.normal(0.0, noise, size=(n, 3))


def in_hull(W: np.ndarray, w: np.ndarray) -> bool:
    """Whether ``w`` is a convex combination of the rows of ``W`` (a feasibility linear program)."""
    n = len(W)
    result = optimize.linprog(
        np.zeros(n), A_eq=np.vstack([W.T, np.ones(n)]), b_eq=np.append(w, 1.0), bounds=[(0, None)] * n
    )
    return result.status == 0


# ----------------------------------------------------------------------------------------------------------------
# Fits
# ----------------------------------------------------------------------------------------------------------------


def test_loglinear_fit_recovers_the_law_on_a_loss_and_through_the_logit():
    W, Y = draw(loglinear_truth, 30, 0.0, seed=0)
    fitted = laws.fit_law("loglinear", W, Y, [False] * 3)
    for j, p in enumerate(fitted.params):
        # Identifiable form: t centred, its mean folded into k (Σw = 1 makes a shift of t a factor of k).
        assert p["c"] == pytest.approx(C[j], abs=1e-6)
        assert p["k"] == pytest.approx(K[j] * np.exp(T[j].mean()), rel=1e-6)
        np.testing.assert_allclose(p["t"], T[j] - T[j].mean(), atol=1e-6)
        assert p["logit"] is False
    # A proportion generated through the sigmoid of the same law is recovered on the logit scale.
    Z = loglinear_truth(W) - 1.5  # inside (-4.6, 4.6): no clipping at 1 % / 99 %
    P = 1.0 / (1.0 + np.exp(-Z))
    proportion = laws.fit_law("loglinear", W, P, [True] * 3)
    assert proportion.params[0]["logit"] is True
    assert proportion.params[0]["c"] == pytest.approx(C[0] - 1.5, abs=1e-5)
    np.testing.assert_allclose(proportion.predict(W), P, atol=1e-6)


def test_cross_validation_chooses_the_generating_form():
    score = lambda Y: Y.mean(axis=1)  # noqa: E731
    W, Y = draw(loglinear_truth, 30, 0.02, seed=1)
    rows = laws.cross_validate(laws.FORMS, W, Y, [False] * 3, score)
    assert laws.choose(rows, by_seed=False).form == "loglinear"
    W, Y = draw(quadratic_truth, 30, 0.02, seed=2)
    rows = laws.cross_validate(laws.FORMS, W, Y, [False] * 3, score)
    assert laws.choose(rows, by_seed=False).form == "scheffe2"


def test_support_check_false_alarm_on_noise_and_hit_on_a_law():
    """The proposal is "supported" only when the chosen form beats the trials' mean on held-out trials (a 95 %
    interval above 0). The smallest CV error alone picks some form on pure noise often; the check must
    not: its false-alarm rate on noise stays near the nominal 5 %, and it fires on a planted law."""
    score = lambda Y: Y.mean(axis=1)  # noqa: E731
    forms = ("constant", "scheffe", "scheffe2", "gp")  # the log-linear law is slow to refit; these make the point
    reps, alarms, picked = 12, 0, 0
    for rep in range(reps):
        rng = np.random.default_rng(100 + rep)
        W, Y = rng.dirichlet(np.ones(3), size=24), rng.normal(size=(24, 3))
        rows = laws.cross_validate(forms, W, Y, [False] * 3, score)
        chosen = laws.choose(rows, by_seed=False)
        picked += chosen.form != "constant"
        if chosen.form != "constant":
            alarms += laws.improvement(chosen, rows[0], Y, score, np.arange(24)).low > 0
    # Wilson 95 % upper bound of the false-alarm rate must reach down to 5 %: at most 2 alarms of 12 (0/12 gives
    # [0, 0.24]; 3/12 would put the point estimate at 25 %).
    assert alarms <= 2, (alarms, picked)
    W, Y = draw(loglinear_truth, 24, 0.05, seed=7)
    rows = laws.cross_validate(forms, W, Y, [False] * 3, score)
    chosen = laws.choose(rows, by_seed=False)
    assert laws.improvement(chosen, rows[0], Y, score, np.arange(24)).low > 0


# ----------------------------------------------------------------------------------------------------------------
# Proposal
# ----------------------------------------------------------------------------------------------------------------


def true_optimum() -> tuple[np.ndarray, float]:
    """The mixture minimising the true mean loss, over the whole simplex (softmax parametrisation)."""
    f = lambda x: loglinear_truth((np.exp(x) / np.exp(x).sum())[None, :])[0].mean()  # noqa: E731
    r = optimize.minimize(f, np.zeros(3), method="Nelder-Mead", options={"xatol": 1e-8, "fatol": 1e-12})
    return np.exp(r.x) / np.exp(r.x).sum(), float(r.fun)


def test_proposal_inside_the_hull_beats_the_best_trial_under_the_truth():
    W, Y = draw(loglinear_truth, 30, 0.02, seed=5)
    optimum, _ = true_optimum()
    assert in_hull(W, optimum)  # the premise: the true optimum lies inside the explored region
    p = propose(sweep_frame(W, Y), sweep_config(), bootstrap=30, seed=0)
    assert p.chosen == "loglinear" and p.supported and p.maximize is False
    w = np.array([p.mixture[t] for t in TASKS])
    assert w.sum() == pytest.approx(1.0) and in_hull(W, w)
    winner = np.array([p.winner["mixture"][t] for t in TASKS])
    assert p.winner["observed"] == pytest.approx(Y.mean(axis=1).min())  # the sweep's in-sample winner
    # In expectation (the noise-free law), the proposal is better (lower) than the best explored trial.
    assert loglinear_truth(w[None, :])[0].mean() < loglinear_truth(winner[None, :])[0].mean()
    assert p.mean_interval[0] <= p.predicted <= p.mean_interval[1]
    assert p.interval[0] <= p.mean_interval[0] and p.mean_interval[1] <= p.interval[1]  # adds a trial's noise


def test_when_no_form_beats_the_mean_the_proposal_is_the_winners_mixture():
    # pure noise, few trials: the constant (the trials' mean) has the smallest held-out error
    rng = np.random.default_rng(3)
    W, Y = rng.dirichlet(np.ones(3), size=10), rng.normal(size=(10, 3))
    p = propose(sweep_frame(W, Y), sweep_config(), forms=("constant", "scheffe2"), bootstrap=10, seed=0)
    assert p.chosen == "constant" and not p.supported
    # a constant predicts every mixture alike: the hull search would return whichever it met first
    assert p.mixture == pytest.approx(p.winner["mixture"]) and p.gain_over_winner == 0.0
    assert any("winner's mixture" in n for n in p.notes)


def test_search_hull_stays_in_the_hull_when_the_optimum_is_outside():
    rng = np.random.default_rng(0)
    W = rng.dirichlet(np.full(3, 5.0), size=12)  # trials near the centre only
    corner = np.array([1.0, 0.0, 0.0])
    best = search_hull(W, lambda M: -((M - corner) ** 2).sum(axis=1), maximize=True)
    assert in_hull(W, best)
    assert ((best - corner) ** 2).sum() <= ((W - corner) ** 2).sum(axis=1).min() + 1e-9


def test_bootstrap_interval_covers_the_truth_in_most_repetitions():
    """The 95 % interval of the predicted objective at the proposal covers the true law's value there in most of
    five independent sweeps (the expected count is 4.75; 3 or fewer would be unlikely at nominal coverage)."""
    covered = 0
    for rep in range(5):
        W, Y = draw(loglinear_truth, 20, 0.03, seed=20 + rep)
        p = propose(sweep_frame(W, Y), sweep_config(), forms=("constant", "loglinear"), bootstrap=30, seed=rep)
        truth = loglinear_truth(np.array([[p.mixture[t] for t in TASKS]]))[0].mean()
        covered += p.mean_interval[0] <= truth <= p.mean_interval[1]
    assert covered >= 4


def test_leave_one_seed_out_with_seeds_and_proportions_through_the_logit():
    W, _ = draw(loglinear_truth, 24, 0.0, seed=9)
    rng = np.random.default_rng(9)
    P = 1.0 / (1.0 + np.exp(-(loglinear_truth(W) - 1.5))) + rng.normal(0, 0.01, size=(24, 3))
    seeds = np.repeat([0, 1, 2], 8)
    p = propose(sweep_frame(W, P, "greedy", seeds, reduce=np.min), sweep_config("greedy", "min"), bootstrap=20)
    assert p.cv_by == "leave-one-seed-out" and p.seeds == 3 and p.maximize is True
    assert all(np.isfinite(r["loso_objective"]) for r in p.cv)
    # the row-level error stays leave-one-trial-out beside the leave-one-seed-out one (not the seeds twice)
    assert all(r["loto_objective"] != pytest.approx(r["loso_objective"]) for r in p.cv)
    assert p.support["folds"] == 3
    assert any("seed" in note for note in p.notes)  # the seed is a varied parameter the fit does not model
    assert p.winner["observed"] == pytest.approx(P.min(axis=1).max())


def test_bad_inputs_are_analysis_errors():
    W, Y = draw(loglinear_truth, 30, 0.02, seed=5)
    trials = sweep_frame(W, Y)
    with pytest.raises(AnalysisError, match="no objective"):
        propose(trials, {"space": sweep_config()["space"]})
    with pytest.raises(AnalysisError, match="several objectives"):
        propose(trials, {"objectives": [{"metric": "eval_loss"}, {"metric": "greedy"}]})
    with pytest.raises(AnalysisError, match="too few"):
        propose(sweep_frame(W[:3], Y[:3]), sweep_config())
    with pytest.raises(AnalysisError, match="besides the constant"):
        propose(trials, sweep_config(), forms=("constant",))
    with pytest.raises(AnalysisError, match="no metric"):
        propose(trials, sweep_config("greedy"))


# ----------------------------------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------------------------------


def write_sweep_dir(path: Path, trials: pl.DataFrame, config: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    trials.write_parquet(path / "trials.parquet")
    (path / "sweep.resolved.yaml").write_text(yaml.safe_dump(config))
    return path


def test_cli_writes_proposal_json_and_refuses_bad_input(tmp_path):
    from harness.cli.app import app

    runner = CliRunner()
    W, Y = draw(loglinear_truth, 16, 0.02, seed=11)
    sweep = write_sweep_dir(tmp_path / "sweep", sweep_frame(W, Y), sweep_config())
    result = runner.invoke(
        app, ["mixture", str(sweep), "--bootstrap", "10", "--form", "constant", "--form", "scheffe2"]
    )
    assert result.exit_code == 0, result.output
    assert "<- chosen" in result.output and "winner" in result.output
    saved = json.loads((sweep / PROPOSAL_NAME).read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert saved["cv"][0]["loso_objective"] is None  # no seeds: no leave-one-seed-out error, null not NaN
    assert saved["chosen"] == "scheffe2" and set(saved["mixture"]) == set(TASKS)
    assert saved["winner"]["observed"] == pytest.approx(Y.mean(axis=1).min())

    for args, words in (
        ([str(tmp_path)], "not a sweep directory"),
        ([str(sweep), "--form", "bimix"], "--form bimix"),
    ):
        result = runner.invoke(app, ["mixture", *args])
        assert result.exit_code == 2 and words in result.output and len(result.output.strip().splitlines()) == 1
    few = write_sweep_dir(tmp_path / "few", sweep_frame(W[:3], Y[:3]), sweep_config())
    result = runner.invoke(app, ["mixture", str(few)])
    assert result.exit_code == 2 and "too few" in result.output
    bare = write_sweep_dir(tmp_path / "bare", sweep_frame(W, Y), {"space": sweep_config()["space"]})
    result = runner.invoke(app, ["mixture", str(bare)])
    assert result.exit_code == 2 and "no objective" in result.output


def test_held_out_sweep_tests_the_law_and_gates_support(tmp_path):
    """A second sweep of the same space is the law's test: on mixtures drawn from the same law the objective's
    held-out Spearman ρ is significantly positive and the proposal stays supported; on held-out outcomes that
    carry no relation to their mixtures (shuffled), the same fit is no longer called supported."""
    W, Y = draw(loglinear_truth, 30, 0.02, seed=5)
    Wh, Yh = draw(loglinear_truth, 16, 0.02, seed=6)
    sweep = write_sweep_dir(tmp_path / "fit", sweep_frame(W, Y), sweep_config())
    held = write_sweep_dir(tmp_path / "held", sweep_frame(Wh, Yh), sweep_config())
    args = ["mixture", str(sweep), "--holdout", str(held), "--bootstrap", "10", "--form", "constant"]
    result = CliRunner().invoke(_app(), [*args, "--form", "scheffe2"])
    assert result.exit_code == 0, result.output
    assert "held-out mixtures (16 rows" in result.output
    saved = json.loads((sweep / PROPOSAL_NAME).read_text())
    assert saved["supported"] and saved["holdout"]["objective"]["rho_low"] > 0
    assert set(saved["holdout"]["targets"]) == set(TASKS) and len(saved["holdout"]["rows"]) == 16
    # --predict on a sweep: the weight columns are the simplex's tasks
    pl.DataFrame(dict(zip(TASKS, [[1 / 3, 0.6], [1 / 3, 0.4], [1 / 3, 0.0]]))).write_csv(tmp_path / "ask.csv")
    result = CliRunner().invoke(_app(), [*args, "--form", "scheffe2", "--predict", str(tmp_path / "ask.csv")])
    assert result.exit_code == 0, result.output
    predicted = pl.read_csv(sweep / "ask.predicted.csv")
    assert predicted.height == 2 and (predicted["low"] < predicted["high"]).all()
    # the same fit, tested on outcomes shuffled across the held-out mixtures: no longer supported
    shuffled = Yh[np.random.default_rng(0).permutation(16)]
    write_sweep_dir(tmp_path / "held", sweep_frame(Wh, shuffled), sweep_config())
    result = CliRunner().invoke(_app(), [*args, "--form", "scheffe2"])
    saved = json.loads((sweep / PROPOSAL_NAME).read_text())
    assert saved["support"]["low"] > 0 and not saved["supported"]  # beats the mean in CV, fails the held-out test
    assert "NOT SUPPORTED" in result.output and "not significantly positive" in result.output


def _app():
    from harness.cli.app import app

    return app


def test_a_form_whose_held_out_fit_diverges_is_left_out_of_the_choice(monkeypatch):
    """A held-out prediction 100× the targets' range off is a fit that ran away on that fold, not a prediction: the
    form's CV error is infinite (never chosen, never printed as 1e20) and the proposal says so in a note."""
    from analysis.mixture_data import LawData
    from analysis.mixture_proposal import propose_data

    rng = np.random.default_rng(0)
    W = rng.dirichlet(np.ones(3), size=20)
    Y = (0.5 + 0.4 * W[:, :1]) + rng.normal(0, 0.01, (20, 1))  # scheffe fits this well
    honest = laws.held_out_predictions

    def runaway(form, W, Y, proportion, folds):
        out = honest(form, W, Y, proportion, folds)
        if form == "scheffe":
            out[3] = 1e9  # one fold's fit blew up
        return out

    monkeypatch.setattr(laws, "held_out_predictions", runaway)
    rows = laws.cross_validate(["constant", "scheffe", "scheffe2"], W, Y, [False], lambda y: y[:, 0])
    scheffe = next(r for r in rows if r.form == "scheffe")
    assert scheffe.diverged == 1 and scheffe.loto_objective == np.inf
    assert laws.choose(rows, by_seed=False).form != "scheffe"
    data = LawData("t", "m", ["a", "b", "c"], ["y"], W, Y, None, [False], lambda y: np.asarray(y)[..., 0], "y", True,
                   Y[:, 0], list(range(20)), kind="table")  # fmt: skip
    notes = propose_data(data, forms=["constant", "scheffe", "scheffe2"], bootstrap=10).notes
    assert any(n.startswith("scheffe: its held-out fits diverged on 1 of 20 rows") for n in notes), notes
