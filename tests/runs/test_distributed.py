"""Data-parallel training: ``harness run FILE --nproc 2`` (two gloo ranks under torchrun) against one process on
the micro experiment — the same per-step training loss, grad norm and batch composition, the same greedy
predictions, samples and metrics — plus rank 0 as the only writer, sharded evaluation equal to one process on the
same weights, a killed rank stopping the run and its resume with 2 ranks equal to the uninterrupted run, and fp32
gradient buckets under bf16 autocast. A non-finite step on one rank stopping both: in process on 2 DDP ranks in
tests/training/test_collectives.py (the report), through ``--nproc 2`` (exit 3, ``nonfinite.json``) in
tests/runs/test_fsdp.py."""

from __future__ import annotations

import json
import time

import numpy as np
import polars as pl
import pytest
import torch
from safetensors.torch import load_file

from harness.core.store import read_metrics
from harness.runs.execution.process_ranks import torchrun_command
from tests.conftest import (
    MICRO,
    PARALLEL_ENV,
    PARALLEL_SETTINGS,
    assert_drift_like_reordering,
    assert_eval_drift_like_reordering,
    continuous_outcome_differences,
    drift_bound,
    invoke,
    proportion_outcomes,
    relative,
    run_cli,
)

# Both runs single-threaded, a row every step (tests/conftest.py), and no stage cache: the two-rank run must train.
ENV = PARALLEL_ENV
SETTINGS = [*PARALLEL_SETTINGS, "--set", "train.stage_cache=false"]
# Metrics decided by argmax/thresholds: must be equal. The rest are floats of weights that differ by rounding.
DISCRETE = {"greedy", "mode_ok", "tf_first", "tf_exact", "ft_top1", "ft_hijack"}
# The micro experiment's stages as rows of its per-step series (steps 1-40, 41-80, 81-140).
STAGE_ROWS = [(0, 40), (40, 80), (80, 140)]


@pytest.fixture(scope="module")
def one_and_two(tmp_path_factory, micro_one_process):
    """The shared one-process micro run (tests/conftest.py) and the same experiment on 2 DDP ranks."""
    two = tmp_path_factory.mktemp("ddp") / "two"
    result = run_cli("run", str(MICRO), "--out", str(two), *SETTINGS, "--nproc", "2", env=ENV)
    assert result.returncode == 0, result.stderr[-4000:]
    return micro_one_process, two


def test_torchrun_command_drops_nproc():
    cmd = torchrun_command(4, ["run", "x.yaml", "--nproc", "4", "--out", "A", "--nproc=4"])
    assert cmd[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", "-m"]
    assert cmd[6:] == ["harness", "run", "x.yaml", "--out", "A"]


def _train_metric(df, metric="loss"):
    return df.filter(pl.col("split") == "train", pl.col("metric") == metric, pl.col("task").is_null()).sort("step")


def test_two_ranks_train_like_one_process(one_and_two, micro_rows_reversed):
    one, two = (read_metrics(d) for d in one_and_two)
    reordered = read_metrics(micro_rows_reversed)  # one process again, each batch's rows summed in reverse order
    a, b, r = (_train_metric(df) for df in (one, two, reordered))
    assert a["step"].to_list() == b["step"].to_list() == list(range(1, 141))  # every step logged, none lost
    assert r["step"].to_list() == a["step"].to_list()
    # The two runs add the same gradient terms in another order (two 8-row halves, then an all-reduce, against one
    # 16-row batch): a difference of rounding, as between one process and its own rows reversed. In the first stage
    # (stable, small gradients) that is all there is; from the second stage on (gradients 5-10x larger, clipped,
    # through Adam) the ulps of either order grow chaotically. Each stage's largest difference is held to
    # DRIFT_FACTOR × the reordered run's in that stage (tests/conftest.py): a wrong averaging over ranks or a rank
    # training on other rows is off by ≥ 1e-2 from the first steps, orders of magnitude above rounding.
    rel, reference = relative(a["value"], b["value"]), relative(a["value"], r["value"])
    assert_drift_like_reordering(rel, reference, STAGE_ROWS, "per-step training loss")
    assert np.median(rel) <= drift_bound(np.median(reference))
    # The gradient both runs clip and step with: its norm per step (DDP all-reduces the ranks' gradients; each
    # rank's loss is its term of the global token mean, so the norm is one process's on the whole batch). The first
    # step has the same weights (only the summation order differs), so it is held to rounding alone.
    a_norm, b_norm, r_norm = (_train_metric(df, "grad_norm") for df in (one, two, reordered))
    assert a_norm["step"].to_list() == b_norm["step"].to_list() == list(range(1, 141))
    grad_rel, grad_reference = relative(a_norm["value"], b_norm["value"]), relative(a_norm["value"], r_norm["value"])
    assert grad_rel[0] <= drift_bound(grad_reference[0]), (grad_rel[0], grad_reference[0])
    assert_drift_like_reordering(grad_rel, grad_reference, STAGE_ROWS, "per-step grad norm")
    # The mixture's batches as drawn: the largest task share of each global batch, not of rank 0's half of it
    share = [_train_metric(df, "batch_task_share_max")["value"].to_list() for df in (one, two)]
    assert len(share[0]) == 140 and share[0] == share[1]
    key = ["stage", "step", "task", "split", "metric"]
    evals = [
        df.filter(pl.col("split") != "train", pl.col("text").is_null()).select(key + ["value"]) for df in (one, two)
    ]
    joined = evals[0].join(evals[1], on=key, how="full", suffix="_2", nulls_equal=True)
    assert joined.height == evals[0].height == evals[1].height  # the same evaluations, at the same steps
    discrete = joined.filter(pl.col("metric").is_in(DISCRETE))
    assert discrete.height > 0 and (discrete["value"] == discrete["value_2"]).all()
    # The teacher-forced loss of each evaluation, stage by stage as the training loss.
    assert_eval_drift_like_reordering(one, two, reordered, "eval_loss")


def _samples(path):
    return [{k: v for k, v in json.loads(line).items() if k != "run_id"} for line in open(path)]


def _prob_differences(rows_a, rows_b) -> np.ndarray:
    """Per sample line, the largest absolute difference of its first-token probabilities (the top 5 by rank, and a
    two-answer task's P(first answer), ``choice_p``)."""
    out = []
    for a, b in zip(rows_a, rows_b):
        diffs = [abs(x["prob"] - y["prob"]) for x, y in zip(a["top5"], b["top5"])]
        out.append(max(diffs + [abs(a.get("choice_p", 0) - b.get("choice_p", 0))]))
    return np.array(out)


def test_two_ranks_give_the_same_predictions_and_rank_0_alone_writes(one_and_two, micro_rows_reversed):
    one, two = one_and_two
    rows = [_samples(d / "samples.jsonl") for d in (one, two)]
    assert len(rows[0]) == len(rows[1]) > 0
    # Same lines in the same order, every field equal but the first-token probabilities (weights apart by rounding):
    # the top-5 probabilities and a two-answer task's P(first answer) (choice_p) within DRIFT_FACTOR × their largest
    # difference between one process and its rows-reversed run (tests/conftest.py), and the gold first token's rank
    # among near-tied untrained tokens may move.
    # The continuous per-item outcomes (answer loss, gold log-probability) are held the same way, each to its own
    # reordered difference; the 0/1 outcomes must be equal.
    floats = ("top5", "gold_first_rank", "choice_p")
    for a, b in zip(*rows):
        a, b = proportion_outcomes(a), proportion_outcomes(b)
        assert {k: v for k, v in a.items() if k not in floats} == {k: v for k, v in b.items() if k not in floats}
        assert ("choice_p" in a) == ("choice_p" in b)
    reordered = _samples(micro_rows_reversed / "samples.jsonl")
    reference = _prob_differences(rows[0], reordered)
    assert reference.size == len(rows[0])
    assert _prob_differences(*rows).max() <= drift_bound(reference)
    continuous, continuous_reference = (
        continuous_outcome_differences(*rows),
        continuous_outcome_differences(rows[0], reordered),
    )
    assert set(continuous) == set(continuous_reference) >= {"eval_loss", "gold_logprob"}
    for name, got in continuous.items():
        assert got <= drift_bound(continuous_reference[name]), (name, got, continuous_reference[name])
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())
    summary = json.loads((two / "summary.json").read_text())
    assert [s["name"] for s in summary["stages"]] == ["repeat_only", "short", "assistant"]


def test_sharded_evaluation_equals_one_process_on_the_same_weights(one_and_two, tmp_path):
    """The two ranks' last evaluation (each rank ran half the batches, gathered) against `harness eval` of the final
    checkpoint in one process: bit-identical samples and metrics, so sharding changes nothing."""
    two = one_and_two[1]
    result = run_cli(
        "eval",
        str(two / "checkpoints" / "assistant"),
        "--experiment",
        str(MICRO),
        "--out",
        str(tmp_path / "eval"),
        "--set",
        "tracking.wandb.mode=disabled",
        env=ENV,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    alone = _samples(tmp_path / "eval" / "samples.jsonl")
    assert alone == [s for s in _samples(two / "samples.jsonl") if s["step"] == 140]
    key = ["stage", "step", "task", "split", "metric"]

    def evals(df):
        return (
            df.filter(
                pl.col("split") != "train",
                pl.col("step") == 140,
                pl.col("task").is_not_null(),
                ~pl.col("metric").str.starts_with("baseline_"),
            )
            .select(key + ["value", "text", "n", "ci_low", "ci_high"])
            .sort(key)
        )

    a, b = evals(read_metrics(tmp_path / "eval")), evals(read_metrics(two).filter(pl.col("stage") == "assistant"))
    assert a.height > 0 and a.equals(b)


def _store(run_dir):
    return (
        read_metrics(run_dir)
        .filter(pl.col("metric") != "tokens_per_s")
        .select("stage", "step", "task", "split", "metric", "value", "text")
        .sort("step", "stage", "task", "split", "metric", nulls_last=True)
    )


def test_a_killed_rank_stops_the_run_and_it_resumes_to_the_uninterrupted_values(one_and_two, tmp_path):
    """Rank 1 SIGKILLs itself before step 52 (debug.kill_rank): the run exits at once with one line naming it and
    its newest resume point (step 45, written by rank 0 with both ranks' states) is whole; resumed with 2 ranks
    (and refused with any other number), it ends with exactly the store and samples of the uninterrupted run."""
    out, checkpoints = tmp_path / "killed", ["--set", "train.checkpoint_every=15"]
    started = time.monotonic()
    killed = run_cli(
        "run",
        str(MICRO),
        "--out",
        str(out),
        *SETTINGS,
        *checkpoints,
        "--nproc",
        "2",
        "--set",
        "debug.kill_rank={rank: 1, step: 52}",
        env={**ENV, "HARNESS_DIST_TIMEOUT": "60"},
    )
    seconds = time.monotonic() - started
    assert killed.returncode == 128 + 9, killed.stderr[-3000:]
    assert killed.stderr.strip().splitlines()[-1] == (
        "error: rank 1 of 2 was killed by SIGKILL (the first rank to fail; torchrun stopped any other still running)"
    )
    assert seconds < 150, f"the run took {seconds:.0f} s to stop"
    point = out / "checkpoints" / "resume" / "step-00000045"
    assert sorted(p.name for p in point.parent.iterdir()) == ["step-00000040", "step-00000045"]
    assert load_file(point / "model.safetensors") and json.loads((point / "state.json").read_text())["world"] == 2
    assert len(torch.load(point / "optimizer.pt", weights_only=True)["ranks"]) == 2
    assert not (out / "summary.json").exists()

    for ranks in ([], ["--nproc", "3"]):  # another number of ranks: refused before anything runs (in process)
        refused = invoke("run", str(MICRO), "--resume", str(out), *SETTINGS, *checkpoints, *ranks)
        assert refused.exit_code == 2 and refused.stderr.strip().splitlines()[-1] == (
            f"--resume: {point} was written by 2 data-parallel ranks, this run has "
            f"{'3 data-parallel ranks' if ranks else 'one process'}; resume it with --nproc 2"
        )
    resumed = run_cli("run", str(MICRO), "--resume", str(out), *SETTINGS, *checkpoints, "--nproc", "2", env=ENV)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["resumed_from"] == "step-00000045"
    two = one_and_two[1]
    assert _store(out).equals(_store(two))
    assert _samples(out / "samples.jsonl") == _samples(two / "samples.jsonl")


def test_bf16_autocast_exchanges_fp32_gradients(tmp_path):
    """Under ``train.precision: bf16-autocast`` the parameters stay fp32 (autocast only computes in bf16), so DDP's
    gradient buckets — what the all-reduce sends — are fp32. In process: one gloo rank, a comm hook that records
    each bucket's dtype."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from harness.config import LossSpec
    from harness.data.batches import Batch
    from harness.training.loop import batch_loss
    from harness.training.parallel.ddp import DataParallel

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    ids = torch.randint(0, 64, (2, 6))
    labels = torch.full_like(ids, -100)
    labels[:, 3:] = ids[:, 3:]
    batch = Batch(ids, torch.ones_like(ids), labels, ["t", "t"], 12, 12)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        parallel, buckets, head = DataParallel(), [], []

        def record(state, bucket):
            buckets.append(bucket.buffer().dtype)
            return allreduce_hook(state, bucket)

        parallel.logits_module(model).register_comm_hook(None, record)
        model.lm_head.register_forward_hook(lambda module, args, out: head.append(out.dtype))
        loss, _, _ = batch_loss(
            model,
            batch,
            LossSpec(),
            torch.zeros(2, dtype=torch.long),
            ["t"],
            precision="bf16-autocast",
            parallel=parallel,
        )
        loss.backward()
    finally:
        dist.destroy_process_group()
    assert head == [torch.bfloat16], "the forward ran under bf16 autocast"
    assert buckets and set(buckets) == {torch.float32}, f"all-reduced bucket dtypes: {buckets}"
    assert {p.grad.dtype for p in model.parameters() if p.grad is not None} == {torch.float32}


def test_the_first_failure_is_the_rank_that_caused_the_others():
    """torchrun's failure timestamps are whole seconds: of two ranks failing in one second, the one killed by a
    signal (or exiting with its own code) is named, not a survivor whose collective then failed (exit 1) or that
    torchrun stopped (SIGTERM)."""
    from types import SimpleNamespace

    from harness.runs.execution.process_ranks import _first_failure

    same_second = {0: SimpleNamespace(timestamp=100, exitcode=1), 1: SimpleNamespace(timestamp=100, exitcode=-9)}
    assert _first_failure(same_second) == (1, -9)
    stopped_by_torchrun = {0: SimpleNamespace(timestamp=7, exitcode=-15), 1: SimpleNamespace(timestamp=7, exitcode=-9)}
    assert _first_failure(stopped_by_torchrun) == (1, -9)
    earlier = {0: SimpleNamespace(timestamp=99, exitcode=1), 1: SimpleNamespace(timestamp=100, exitcode=3)}
    assert _first_failure(earlier) == (0, 1)
    assert _first_failure(
        {0: SimpleNamespace(timestamp=5, exitcode=3), 1: SimpleNamespace(timestamp=5, exitcode=3)}
    ) == (0, 3)


def test_a_rank_that_cannot_see_the_run_directory_says_so_in_one_line(tmp_path):
    from harness.runs.execution.process_ranks import _scratch_for_resume
    from harness.runs.execution.rundir import RunDirError

    with pytest.raises(RunDirError) as info:
        _scratch_for_resume(tmp_path / "elsewhere", tmp_path / "scratch" / "run")
    assert "\n" not in str(info.value) and "elsewhere/checkpoints" in str(info.value)
    assert not (tmp_path / "scratch").exists()
