"""The ``forgetting`` probe: the loss on a fixed reference text next to the base model's, at every evaluation, with
a paired interval over documents, joining the seesaw as a task that can fall.

Tiny runs (shared by the tests here) with and without the probe; a planted forgetting (a stage at a learning rate
fifty times the tiny experiment's); simulated runs for the seesaw's false-alarm and hit rates."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from data_recipes.reference_text import DEFAULT_DOCUMENTS, file_documents
from harness.config import ConfigError, validate_data
from harness.core.seesaw_sim import Schedule, simulate_outcomes
from harness.core.seesaw_sim import outcome_rows as simulated_rows
from harness.core.stats import wilson_interval
from harness.evaluation.evidence import run_seesaw
from harness.evaluation.forgetting import REF_FAMILY, REF_OUTCOME, ReferenceText, encode_documents
from tests.conftest import TINY, invoke, run_cli, write_yaml

KEEP = ["stage", "step", "task", "split", "metric", "value"]


def _experiment(probes: list[str] | None = None, **eval_settings) -> dict:
    exp = copy.deepcopy(TINY)
    if probes is not None:
        exp["eval"]["probes"] = probes
    exp["eval"].update(eval_settings)
    exp["tracking"]["console"] = True  # the final table is read back
    return exp


def _run(tmp: Path, exp: dict, name: str = "run") -> Path:
    out = tmp / name
    result = run_cli("run", str(write_yaml(tmp / f"{name}.yaml", exp)), "--out", str(out))
    assert result.returncode == 0, result.stderr[-4000:]
    (out / "console.txt").write_text(result.stdout + result.stderr)
    return out


def _ref_rows(run: Path) -> pl.DataFrame:
    return pl.read_parquet(run / "metrics.parquet").filter(pl.col("split") == "ref")


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("forgetting"), _experiment(["first_token", "forgetting"]))


# -- the reference text ------------------------------------------------------------------------------------------


def test_world_sample_is_held_out_from_pretraining_and_deterministic():
    from data_recipes import build_world, corpus, heldout_corpus

    world = build_world(40, 3)
    pretraining = corpus(world, 3)
    docs = heldout_corpus(world, pretraining, DEFAULT_DOCUMENTS)
    assert len(docs) == DEFAULT_DOCUMENTS == len(set(docs))
    assert not set(docs) & set(pretraining)
    assert docs == heldout_corpus(world, pretraining, DEFAULT_DOCUMENTS)
    names = {p.name for p in world.people}
    assert any(name in doc for doc in docs for name in names), "documents about the world's people"


def _tiny_model():
    from data_recipes import build_world, corpus
    from harness.config import ModelSpec
    from harness.models.builtin import build_builtin
    from harness.models.tokenizer import train_tokenizer

    docs = corpus(build_world(40, 3), 3)
    spec = ModelSpec.model_validate(TINY["model"] | {"pretrain": None})
    tokenizer = train_tokenizer(docs, 400, 2)
    return build_builtin(spec, tokenizer, 3), tokenizer, docs


def _direct_losses(model, sequences: list[list[int]], padded: bool = False) -> np.ndarray:
    """Each sequence's mean next-token cross-entropy computed otherwise than the probe: log-softmax and gather in
    float64, one sequence per forward (no padding), or ``padded``: all of them in one right-padded batch."""
    import torch

    with torch.no_grad():
        if not padded:
            logits = [model(input_ids=torch.tensor([s])).logits[0] for s in sequences]
        else:
            width = max(len(s) for s in sequences)
            ids = torch.tensor([s + [0] * (width - len(s)) for s in sequences])
            mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences])
            batch = model(input_ids=ids, attention_mask=mask).logits
            logits = [batch[row, : len(s)] for row, s in enumerate(sequences)]
    out = []
    for seq, rows in zip(sequences, logits):
        logp = torch.log_softmax(rows[:-1].double(), dim=-1)
        out.append(-logp.gather(1, torch.tensor(seq[1:])[:, None]).mean().item())
    return np.array(out)


def test_probe_loss_equals_a_direct_computation_on_the_same_documents():
    model, tokenizer, docs = _tiny_model()
    ref = ReferenceText("world", docs[:20], tokenizer, model, batch_size=8)
    sequences = encode_documents(tokenizer, docs[:20], None)
    assert all(s[0] == s[-1] == tokenizer.eos_token_id for s in sequences)
    direct = _direct_losses(model, sequences)
    # The probe pads and batches 8 documents at a time and reduces in float32: it may differ from the direct
    # computation by float noise only. Tolerance: how far the direct computation itself moves when the same
    # documents go through one padded batch (a reordering of the same arithmetic), four times over; at least the
    # float32 rounding of a sum of the longest document's terms (the probe's reduction).
    noise = float(np.abs(_direct_losses(model, sequences, padded=True) - direct).max())
    floor = float(np.finfo(np.float32).eps) * float(direct.max()) * max(len(s) for s in sequences)
    tolerance = 4 * max(noise, floor)
    rows, samples = ref.evaluate(model)
    values = {metric: value for _, _, metric, value, *_ in rows}
    assert np.abs(ref.losses(model) - direct).max() <= tolerance
    assert values["ref_loss"] == pytest.approx(float(direct.mean()), abs=tolerance)
    assert values["ref_ppl"] == pytest.approx(math.exp(values["ref_loss"]), rel=1e-12)
    assert [s["outcomes"][REF_OUTCOME] for s in samples] == [-s["ref_loss"] for s in samples]
    assert values["ref_loss_delta"] == 0.0 and values["ref_loss_base"] == values["ref_loss"]


def test_the_probe_draws_no_random_number_and_restores_module_modes():
    import torch

    model, tokenizer, docs = _tiny_model()
    model.train()
    state = torch.get_rng_state()
    ReferenceText("world", docs[:8], tokenizer, model).evaluate(model)
    assert torch.equal(state, torch.get_rng_state())
    assert all(m.training for m in model.modules())


# -- a run -------------------------------------------------------------------------------------------------------


def test_base_reference_equals_the_current_model_before_training(probe_run):
    rows = _ref_rows(probe_run)
    assert set(rows["task"]) == {"ref:world"}
    assert set(rows["metric"]) == {"ref_loss", "ref_ppl", "ref_loss_base", "ref_loss_delta"}
    first = {r["metric"]: r for r in rows.filter(pl.col("step") == 0).iter_rows(named=True)}
    assert first["ref_loss"]["value"] == first["ref_loss_base"]["value"]
    delta = first["ref_loss_delta"]
    assert (delta["value"], delta["ci_low"], delta["ci_high"], delta["n"]) == (0.0, 0.0, 0.0, DEFAULT_DOCUMENTS)
    # at every evaluation: the base value is the same, every row carries n and an interval holding its value
    assert rows.filter(pl.col("metric") == "ref_loss_base")["value"].n_unique() == 1
    assert (rows["ci_low"] <= rows["value"] + 1e-12).all() and (rows["value"] <= rows["ci_high"] + 1e-12).all()
    steps = sorted(set(pl.read_parquet(probe_run / "metrics.parquet").filter(pl.col("metric") == "greedy")["step"]))
    assert sorted(set(rows["step"])) == steps, "measured at every evaluation"
    last = rows.filter((pl.col("step") == max(steps)) & (pl.col("metric") == "ref_loss_delta")).row(0, named=True)
    assert last["value"] != 0.0, "training moved it"


def test_summary_and_console_show_the_reference_rows(probe_run):
    summary = json.loads((probe_run / "summary.json").read_text())
    last = summary["stages"][-1]
    assert set(last["metrics"]["ref"]["ref:world"]) >= {"ref_loss", "ref_loss_base", "ref_loss_delta", "ref_ppl"}
    assert last["intervals"]["ref"]["ref:world"]["ref_loss_delta"]["n"] == DEFAULT_DOCUMENTS
    console = (probe_run / "console.txt").read_text()
    assert "reference text" in console and "ref:world" in console


def test_the_probe_changes_no_training_row(probe_run, tmp_path):
    """The probe draws no random number and feeds nothing back: every row but its own (and the seesaw's, whose
    family it joins) is the same without it."""
    plain = _run(tmp_path, _experiment(["first_token"]), "plain")
    numeric = (
        (pl.col("split") != "ref")
        & ~pl.col("metric").is_in(["seesaw", "seesaw_tests"])
        & ~pl.col("metric").str.contains("seconds|_s$|time|tokens_per_s")
    )
    with_probe = pl.read_parquet(probe_run / "metrics.parquet").filter(numeric).select(KEEP)
    without = pl.read_parquet(plain / "metrics.parquet").filter(numeric).select(KEEP)
    assert with_probe.filter(pl.col("metric") == "loss").height > 0
    assert with_probe.sort(KEEP[:5]).equals(without.sort(KEEP[:5]))


def test_a_users_file_is_the_reference_text_and_a_planted_forgetting_makes_its_loss_rise(tmp_path):
    """The reference text from a user's file (here 40 documents of the world's kind, one per line, blank lines
    between some), and a last stage at 50× the tiny experiment's learning rate on one task, which wrecks what
    pretraining taught: the reference loss rises above the base's, the paired interval excluding 0."""
    from data_recipes import build_world, corpus

    docs = corpus(build_world(TINY["world"]["people"], 11), 11)[:40]
    text = tmp_path / "my_text.txt"
    text.write_text("\n".join(d + ("\n" if i % 7 == 0 else "") for i, d in enumerate(docs)) + "\n  \n")
    assert file_documents(text) == docs
    exp = _experiment(["forgetting"], reference_text="my_text.txt")  # relative to the experiment file
    exp["stages"].append({"name": "wreck", "steps": 8, "mixture": {"math": 1.0}, "optim": {"lr": 0.15, "warmup": 0}})
    rows = _ref_rows(_run(tmp_path, exp))
    assert set(rows["task"]) == {"ref:my_text"} and set(rows["n"]) == {40}
    wrecked = rows.filter((pl.col("stage") == "wreck") & (pl.col("metric") == "ref_loss_delta"))
    last = wrecked.sort("step").row(-1, named=True)
    assert last["ci_low"] > 0, last


@pytest.mark.parametrize(
    "content, message",
    [(None, "no reference text file '{path}'"), ("\n  \n", "reference text file '{path}' has no documents")],
)
def test_a_missing_or_empty_file_is_one_line_and_exit_2(tmp_path, content, message):
    path = tmp_path / "absent.txt"
    if content is not None:
        path.write_text(content)
    exp = _experiment(["forgetting"], reference_text="absent.txt")
    result = invoke("validate", str(write_yaml(tmp_path / "exp.yaml", exp)))
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if "reference_text" in line]
    assert len(errors) == 1 and message.format(path=path) in errors[0], result.output


def test_an_hf_base_without_a_file_is_a_config_error():
    exp = _experiment(["forgetting"])
    exp["model"] = {"hf": "some/model"}
    with pytest.raises(ConfigError, match=r"eval.probes\[0\].*needs eval.reference_text"):
        validate_data(exp)


# -- the seesaw --------------------------------------------------------------------------------------------------


def _history(rng: np.random.Generator, forgetting: bool) -> list[dict]:
    """A simulated run: 4 tasks × 2 splits of 200 items over 6 evaluations (stationary churn, accuracy 0.3) in which
    task t0 (split s0) rises by 0.6 between the 3rd and 4th evaluation, and the reference text's 64 per-document
    log-likelihoods at every evaluation (fixed difficulty, per-evaluation noise of sd 0.05 nats). ``forgetting``:
    over the same interval every document's loss rises by 0.3 nats on average (sd 0.1); otherwise the reference
    only churns (the partial null: a task moves, the reference does not)."""
    schedule = Schedule(tasks=4, splits=2, intervals=5, items=200, accuracy=0.3)
    outcomes = simulate_outcomes(schedule, rng)
    docs = -rng.uniform(2.0, 4.0, 64) + rng.normal(0.0, 0.05, (6, 64))
    first = outcomes[3, 0, 0]
    outcomes[3:, 0, 0] = first | (np.flatnonzero(~first)[:120, None] == np.arange(200)).any(axis=0)
    if forgetting:
        docs[3:] -= rng.normal(0.3, 0.1, 64)
    rows = simulated_rows(outcomes)
    for k in range(6):
        rows.append(
            {"step": k * 10, "stage": "sim", "task": "ref:world", "split": "ref", "metric": REF_OUTCOME,
             "outcomes": docs[k].tolist()}
        )  # fmt: skip
    return rows


def test_seesaw_names_a_planted_forgetting_and_not_a_reference_that_only_churns():
    """Hit rate on a planted forgetting beside a rising task; false-alarm rate when the same task rises and the
    reference does not change (100 simulated runs each; 95 % Wilson intervals)."""
    rng = np.random.default_rng(0)
    runs = 100
    hits = false_alarms = 0
    for _ in range(runs):
        events, _ = run_seesaw(_history(rng, True), [], test="paired", delta=0.15, alpha=0.05, seed=0)
        ref = [e for e in events if e["metric"] == REF_FAMILY]
        hits += any(e["fell"] == "ref:world" and e["rose"] == "t0/s0" and e["test"] == "mcnemar" for e in ref)
        events, _ = run_seesaw(_history(rng, False), [], test="paired", delta=0.15, alpha=0.05, seed=0)
        false_alarms += any(e["metric"] == REF_FAMILY for e in events)
    hit_rate, alarm_rate = wilson_interval(hits, runs), wilson_interval(false_alarms, runs)
    assert hit_rate.low >= 0.9, hit_rate
    assert alarm_rate.high <= 0.05, alarm_rate


def test_the_reference_test_is_a_paired_t_test_without_a_resampling_floor():
    rng = np.random.default_rng(1)
    rows = _history(rng, True)
    from harness.core.seesaw import change_tests
    from harness.evaluation.forgetting import paired_t_pvalues, reference_family

    family = reference_family(rows)
    tests = change_tests(family, [REF_FAMILY], seed=0)
    paired_t_pvalues(tests, family)
    ref = [t for t in tests if t["task"] == "ref:world"]
    assert len(ref) == 5 and {t["test"] for t in ref} == {"paired_t"}
    jump = [t for t in ref if t["step_from"] == 20][0]
    assert jump["p_raw"] < 1e-20 and jump["change"] == pytest.approx(-0.3, abs=0.05)
