"""FSDP2 training (``train.parallel: fsdp``, harness/training/parallel/fsdp.py): two gloo ranks under torchrun against
one process — the micro experiment (full fine-tuning: per-step training loss and grad norm, evaluations, greedy
predictions), the tiny experiment with a LoRA adapter and new-token row masks (losses, masked rows untouched, the
checkpoint rank 0 writes loading in one process), an fsdp run's resume point resumed by 2 ranks (one process refused),
and a NaN on one rank stopping both (exit 3 through ``--nproc 2``, the report written by rank 0)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import polars as pl
import pytest
from safetensors.torch import load_file

from harness.core.store import read_metrics
from tests.conftest import (
    EVERY_EVAL_WEIGHTS,
    MICRO,
    PARALLEL_ENV,
    PARALLEL_SETTINGS,
    ROOT,
    TINY,
    assert_drift_like_reordering,
    assert_eval_drift_like_reordering,
    drift_bound,
    invoke,
    proportion_outcomes,
    relative,
    rows_reversed_run,
    run_cli,
    write_yaml,
)

# As tests/runs/test_distributed.py: both sides single-threaded, so only the data-parallel arithmetic differs.
# A collective one rank skips would hang the other: fail after 2 minutes instead of the default 30.
ENV = {**PARALLEL_ENV, "HARNESS_DIST_TIMEOUT": "120"}
FSDP = ["--nproc", "2", "--set", "train.parallel=fsdp"]
DISCRETE = {"greedy", "mode_ok", "tf_first", "tf_exact", "ft_top1", "ft_hijack"}
STAGE_ROWS = [(0, 40), (40, 80), (80, 140)]  # the micro experiment's stages as rows of its per-step series
# LoRA with the added tokens' rows trained through row masks on an untied embedding and head (the special-token
# check then reads each rank's slice of the batch for the embedding); the runs also write resume points (every 2
# steps, all kept) and skip the stage cache (they must train).
LORA = {
    **TINY,
    "model": {**TINY["model"], "config": {**TINY["model"]["config"], "tie_word_embeddings": False}},
    "train": {
        **TINY["train"],
        "trainable": {"mode": "lora", "r": 4},
        "log_every": 1,
        "checkpoint_every": 2,
        "keep_checkpoints": 10,
        "stage_cache": False,
    },
}


@pytest.fixture(scope="module")
def micro_pair(tmp_path_factory, micro_one_process):
    """The shared one-process micro run and the same experiment on 2 fsdp ranks (stage cache on: rank 0 stores)."""
    two = tmp_path_factory.mktemp("fsdp") / "fsdp"
    result = run_cli("run", str(MICRO), "--out", str(two), *PARALLEL_SETTINGS, *EVERY_EVAL_WEIGHTS, *FSDP, env=ENV)
    assert result.returncode == 0, result.stderr[-4000:]
    return micro_one_process, two


@pytest.fixture(scope="module")
def lora_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp_lora")
    exp_file = write_yaml(root / "lora.yaml", LORA)
    for name, extra in (("one", []), ("fsdp", FSDP)):
        result = run_cli("run", str(exp_file), "--out", str(root / name), *extra, env=ENV)
        assert result.returncode == 0, result.stderr[-4000:]
    return exp_file, root / "one", root / "fsdp"


@pytest.fixture(scope="module")
def lora_rows_reversed(lora_pair):
    """``lora_pair``'s one-process run again with every training batch's rows reversed (tests/conftest.py): how far
    rounding alone takes it on this CPU, the reference of the LoRA comparisons' tolerances."""
    exp_file, one, _ = lora_pair
    return rows_reversed_run(exp_file, one.parent / "reversed", [])


def _train_metric(df: pl.DataFrame, metric: str) -> np.ndarray:
    rows = df.filter(pl.col("split") == "train", pl.col("metric") == metric, pl.col("task").is_null()).sort("step")
    assert rows["step"].to_list() == list(range(1, rows.height + 1))  # every step logged, none lost
    return rows["value"].to_numpy()


def _relative(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    assert a.shape == b.shape
    return np.abs(a - b) / np.abs(a)


def test_fsdp_trains_like_one_process(micro_pair, micro_rows_reversed):
    one, two = (read_metrics(d) for d in micro_pair)
    reordered = read_metrics(micro_rows_reversed)  # one process again, each batch's rows summed in reverse order
    rel = relative(_train_metric(one, "loss"), _train_metric(two, "loss"))
    reference = relative(_train_metric(one, "loss"), _train_metric(reordered, "loss"))
    assert rel.size == reference.size == 140
    # FSDP adds the same gradient terms in another order (two half-batches reduce-scattered, norms of shards): a
    # difference of rounding, as between one process and its own rows reversed. Stage 1 is stable; from stage 2 on
    # (gradients 10x larger, clipped, through Adam) the ulps of either order grow chaotically. Each stage's largest
    # difference is held to DRIFT_FACTOR × the reordered run's in that stage (tests/conftest.py). The gradients FSDP
    # reduce-scatters equal one process's: the first step's grad norm (same weights, one gradient; the norm of the
    # shards all-reduced) is held to rounding alone — a wrong averaging factor over ranks would be off by 2x.
    assert_drift_like_reordering(rel, reference, STAGE_ROWS, "per-step training loss")
    assert np.median(rel) <= drift_bound(np.median(reference))
    grad_rel = relative(_train_metric(one, "grad_norm"), _train_metric(two, "grad_norm"))
    grad_reference = relative(_train_metric(one, "grad_norm"), _train_metric(reordered, "grad_norm"))
    assert grad_rel[0] <= drift_bound(grad_reference[0]), (grad_rel[0], grad_reference[0])
    assert_drift_like_reordering(grad_rel, grad_reference, STAGE_ROWS, "per-step grad norm")

    key = ["stage", "step", "task", "split", "metric"]
    evals = [
        df.filter(pl.col("split") != "train", pl.col("text").is_null()).select(key + ["value"]) for df in (one, two)
    ]
    joined = evals[0].join(evals[1], on=key, how="full", suffix="_2", nulls_equal=True)
    assert joined.height == evals[0].height == evals[1].height  # the same evaluations, at the same steps
    assert_eval_drift_like_reordering(one, two, reordered, "eval_loss")
    discrete = joined.filter(pl.col("metric").is_in(DISCRETE))
    # Measured: 1 of 864 cells differs — an ft_hijack where "Yes" and "<|im_end|>" are tied to 3e-4 (below).
    assert discrete.height > 0 and (discrete["value"] != discrete["value_2"]).sum() <= 0.01 * discrete.height


def test_fsdp_predictions_differ_only_at_near_ties(micro_pair):
    """Where a prediction differs between one process and fsdp, the two models' decision there was a near tie.

    Not a tolerance measured on one CPU (AMD and Intel kernels sum in other orders): at a position where model A
    picks x and model B picks y, A's margin ``LA[x] − LA[y]`` and B's ``LB[y] − LB[x]`` add up to
    ``ΔL[x] − ΔL[y] ≤ 2·max|ΔL|`` there (ΔL = LA − LB). So the check is that at every position where the two
    models' greedy choices part — the first answer token (``tf_first``, the probes) and every step of either
    model's greedy answer (``pred``), the differing prediction's own decision — the margins add up to at most
    2 × the largest |ΔL| between the two models measured in the same test at *other* positions (every teacher-forced
    position of every evaluation item at that step). A decided choice that differs (a real difference between the
    two trainings, not summation order) has margins far beyond the rounding between them and fails. The logits are
    recomputed from each evaluation's weights (resume points at every evaluation), one item at a time."""
    rows = [[json.loads(line) for line in open(d / "samples.jsonl")] for d in micro_pair]
    assert len(rows[0]) == len(rows[1]) > 0
    differing: dict[int, list[tuple[str, str, int]]] = {}
    for a, b in zip(*rows):
        assert (a["step"], a["task"], a["split"], a["index"]) == (b["step"], b["task"], b["split"], b["index"])
        # The 0/1 outcomes only: the continuous per-item ones (answer loss, gold log-probability) move with rounding;
        # their aggregate, each evaluation's eval_loss, is held to the reordered run's drift in
        # test_fsdp_trains_like_one_process (per item they are compared under DDP, tests/runs/test_distributed.py).
        if (a["pred"], a["correct"], a["tf_first"], proportion_outcomes(a)["outcomes"]) != (
            b["pred"],
            b["correct"],
            b["tf_first"],
            proportion_outcomes(b)["outcomes"],
        ):
            differing.setdefault(a["step"], []).append((a["task"], a["split"], a["index"]))
    assert sum(map(len, differing.values())) <= 0.01 * len(rows[0])
    assert 0 not in differing, "the base model's predictions differ: the same weights on both sides"
    if differing:
        _check_near_ties(micro_pair, differing)
    one, two = micro_pair
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())  # rank 0 alone writes


def _check_near_ties(runs, differing: dict[int, list[tuple[str, str, int]]], seen: list | None = None) -> None:
    """The check of :func:`test_fsdp_predictions_differ_only_at_near_ties`; ``seen`` (when given) receives
    ``(step, key, margins, largest |ΔL| elsewhere)`` of every position where the models' choices part."""
    import torch
    from safetensors.torch import load_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harness.config import load_experiment
    from harness.data.answer_lengths import default_max_new_tokens
    from harness.data.encoding import position_limit
    from harness.evaluation.lengths import stop_token_ids
    from harness.runs.planning.prepare import build_task_data, encode_task_data

    final = runs[0] / "checkpoints" / "assistant"  # the architecture and tokenizer (weights: each resume point)
    tokenizer = AutoTokenizer.from_pretrained(final)
    models = [AutoModelForCausalLM.from_pretrained(final).eval() for _ in runs]
    exp = load_experiment(runs[0] / "config.resolved.yaml")
    items = encode_task_data(exp, build_task_data(exp), tokenizer, position_limit(models[0].config)).eval_items
    by_key = {(i.task, i.split, i.index): i for i in items}
    stops, max_new = set(stop_token_ids(tokenizer, models[0].generation_config)), default_max_new_tokens(items)

    def logits(ids: list[int]) -> list[torch.Tensor]:
        with torch.no_grad():
            return [m(torch.tensor([ids])).logits[0].double() for m in models]

    for step, keys in sorted(differing.items()):
        for model, run in zip(models, runs):
            load_model(model, str(run / "checkpoints" / "resume" / f"step-{step:08d}" / "model.safetensors"))
        elsewhere = 0.0  # max |ΔL| over every teacher-forced position of every item
        for item in items:
            a, b = logits(item.prompt_ids + item.gold_ids)
            elsewhere = max(elsewhere, float((a - b)[len(item.prompt_ids) - 1 :].abs().max()))
        for key in keys:
            item = by_key[key]
            for path_of in range(len(models)):  # each model's own greedy answer, position by position
                ids = list(item.prompt_ids)
                for _ in range(max_new):
                    a, b = (x[-1] for x in logits(ids))
                    x, y = int(a.argmax()), int(b.argmax())
                    margins = float(a[x] - a[y]) + float(b[y] - b[x])
                    if seen is not None and x != y:
                        seen.append((step, key, margins, elsewhere))
                    assert margins <= 2 * elsewhere, (
                        f"step {step} {key}: after {len(ids) - len(item.prompt_ids)} answer tokens the models "
                        f"choose {x} and {y} with margins adding up to {margins:.3g} > 2 × {elsewhere:.3g}, the "
                        f"largest logit difference between them elsewhere: a decided choice differs"
                    )
                    ids.append(x if path_of == 0 else y)
                    if ids[-1] in stops:
                        break


def _weight_differences(w1: dict, w2: dict) -> np.ndarray:
    """Per tensor of two checkpoints, the largest difference relative to the first's largest magnitude."""
    assert w1.keys() == w2.keys()
    return np.array([float((w1[k] - w2[k]).abs().max() / w1[k].abs().max().clamp_min(1e-30)) for k in sorted(w1)])


def test_fsdp_lora_with_row_masks_and_its_checkpoint(lora_pair, lora_rows_reversed):
    _, one, two = lora_pair
    a, b, r = read_metrics(one), read_metrics(two), read_metrics(lora_rows_reversed)
    # LoRA on the sharded blocks, the embedding row-masked (the added tokens' rows train): rounding apart, as one
    # process and its own rows reversed are (tests/conftest.py), stage by stage.
    loss, reference = (relative(_train_metric(a, "loss"), _train_metric(x, "loss")) for x in (b, r))
    assert_drift_like_reordering(loss, reference, [(0, 4), (4, 8)], "per-step training loss")
    report = json.loads((two / "checkpoints" / "b" / "meta.json").read_text())["trainable"]
    assert report["trainable"] > report["adapter"] > 0, "the run trained masked embedding rows besides the adapter"
    # The merged checkpoints: every embedding and head row outside the trained rows is bitwise the one-process
    # run's (the mask, applied to each rank's shard of the gradient, kept them still); the trained rows moved alike.
    w1, w2, w3 = (load_file(d / "checkpoints" / "b" / "model.safetensors") for d in (one, two, lora_rows_reversed))
    assert w1.keys() == w2.keys()
    rows = (report["trainable"] - report["adapter"]) // (2 * w1["lm_head.weight"].shape[1])  # per matrix
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        moved = (w1[name] - w2[name]).abs().amax(1).nonzero().flatten().tolist()
        assert len(moved) <= rows, f"{name}: rows outside the mask differ: {moved}"
    assert _weight_differences(w1, w2).max() <= drift_bound(_weight_differences(w1, w3))
    assert (two / "checkpoints" / "b" / "adapter" / "adapter_model.safetensors").exists()
    ev = run_cli(
        "eval",
        str(two / "checkpoints" / "b"),
        "--experiment",
        str(lora_pair[0]),
        "--out",
        str(two.parent / "eval"),
        env=ENV,
    )  # the checkpoint rank 0 wrote, evaluated in one process
    assert ev.returncode == 0, ev.stderr[-3000:]


def test_fsdp_resume_point_resumes_with_the_same_ranks(lora_pair, lora_rows_reversed, tmp_path):
    exp_file, one, two = lora_pair
    # The fsdp run's optimiser state is saved gathered, in the one-process format, like the one-process run's, and
    # holds the same moments to rounding (as far as one process's with its rows reversed, tests/conftest.py).
    import torch

    saved = [
        torch.load(d / "checkpoints" / "resume" / "step-00000006" / "optimizer.pt", weights_only=True)["optimizer"]
        for d in (one, two, lora_rows_reversed)
    ]
    assert [g["params"] for g in saved[0]["param_groups"]] == [g["params"] for g in saved[1]["param_groups"]]
    assert saved[0]["state"].keys() == saved[1]["state"].keys() == saved[2]["state"].keys()
    moments = [{str(i): state["exp_avg"] for i, state in s["state"].items()} for s in saved]
    got, reference = _weight_differences(moments[0], moments[1]), _weight_differences(moments[0], moments[2])
    assert got.max() <= drift_bound(reference), (got.max(), reference.max())
    # "Kill" the fsdp run after step 6: one process may not resume it (another run's sums); 2 fsdp ranks shard the
    # saved state back and end where the uninterrupted fsdp run did.
    killed = tmp_path / "killed"
    shutil.copytree(two, killed)
    shutil.rmtree(killed / "checkpoints" / "resume" / "step-00000008")
    (killed / "summary.json").unlink()
    refused = invoke("run", str(exp_file), "--resume", str(killed), *FSDP[2:])  # in process: refused at once
    assert refused.exit_code == 2 and "resume it with --nproc 2" in refused.stderr, refused.output[-2000:]
    result = run_cli("run", str(exp_file), "--resume", str(killed), *FSDP, env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((killed / "summary.json").read_text())["resumed_from"] == "step-00000006"
    rel = _relative(_train_metric(read_metrics(two), "loss"), _train_metric(read_metrics(killed), "loss"))
    assert rel.size == 8 and rel.max() < 1e-6


@pytest.mark.slow  # ~45 s for a smoke test of the policy (make test-all); its numbers matter on a GPU
def test_fsdp_bf16_autocast_runs_mixed_precision(tiny, tmp_path):
    """precision: bf16-autocast → MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32): the blocks
    compute from bf16 copies of the weights (norm weights included, unlike autocast alone), so the losses agree with
    one process's autocast to bf16 precision only: within one bf16 rounding (its unit roundoff 2⁻⁸, a property of the
    format, not of the CPU) over the tiny run's 8 steps."""
    import torch

    tiny["train"].update(precision="bf16-autocast", log_every=1)
    exp_file = write_yaml(tmp_path / "bf16.yaml", tiny)
    for name, extra in (("one", []), ("fsdp", FSDP)):
        result = run_cli("run", str(exp_file), "--out", str(tmp_path / name), *extra, env=ENV)
        assert result.returncode == 0, result.stderr[-4000:]
    rel = _relative(*(_train_metric(read_metrics(tmp_path / n), "loss") for n in ("one", "fsdp")))
    assert rel.size == 8 and 0 < rel.max() < torch.finfo(torch.bfloat16).eps / 2


def test_fsdp_nan_on_one_rank_stops_both_and_names_it(tiny, tmp_path):
    tiny["debug"] = {"inject_nonfinite": {"step": 3, "where": "forward", "module": r"layers\.0\.mlp$", "rank": 1}}
    out = tmp_path / "run"
    result = run_cli("run", str(write_yaml(tmp_path / "x.yaml", tiny)), "--out", str(out), *FSDP, env=ENV)
    assert result.returncode == 3, "the guard's exit code, through torchrun"
    assert "of 2 exited with code 3 (the first rank to fail" in result.stderr.strip().splitlines()[-1]
    report = json.loads((out / "nonfinite.json").read_text())  # written by rank 0, with rank 1's report
    assert report["rank"] == 1 and report["step"] == 3 and report["what"] == "loss"
    # the module as rank 1 saw it in the sharded replica's re-run; the gradients named from every rank's shards
    assert report["first_module"] == "model.layers.0.mlp"
    assert "model.layers.0.mlp.down_proj.weight" in report["nonfinite_grads"]


def test_rank_0_alone_stores_the_data_parallel_stages(micro_pair):
    """Every rank ends each stage, but only rank 0 (the run the directory holds) writes the stage-cache entry: a
    rank-1 entry would name a scratch run that no longer exists as its source."""
    from harness.runs.execution.stage_cache import META, stages_root

    _, two = micro_pair
    run_id = json.loads((two / "run.json").read_text())["run_id"]
    stored = [json.loads(p.read_text()) for p in stages_root().glob(f"*/{META}")]
    ours = sorted(m["stage"] for m in stored if m["source_run_id"] == run_id)
    assert ours == ["assistant", "repeat_only", "short"], [m["source_run_id"] for m in stored]


def test_fsdp_with_an_image_text_builtin_is_refused_when_the_file_is_checked():
    result = invoke("validate", str(ROOT / "experiments" / "vision.yaml"), "--set", "train.parallel=fsdp")
    assert result.exit_code == 2
    assert "train.parallel: fsdp does not support image-text models yet; use ddp" in result.stderr
