"""The data-parallel hooks' collectives (harness/training/parallel/ddp.py) and each rank's random generators in
resume points and stage-cache entries, on two gloo ranks spawned once for the module (one fixture, several
assertions).

Every collective call is recorded with the device of each tensor it is handed. On a CPU every tensor is on the CPU
and gloo takes anything, so this is the coverage half (the calls happen, with tensors on the hooks' device); the half
that tells devices apart, on ``meta``, is tests/training/test_collective_devices.py.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist

WORLD = 2
# Per rank: (loss non-finite, gradient non-finite) of one step, and the ranks every rank must then name.
BAD_CASES = [
    (((False, False), (False, False)), []),
    (((False, False), (False, True)), [1]),
    (((False, True), (True, True)), [1]),  # a NaN loss on rank 1 reached rank 0's gradient: rank 1 began it
    (((False, True), (False, True)), [0, 1]),
    (((True, True), (True, True)), [0, 1]),
]
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "all_to_all_single",
    "all_gather_object",
    "gather_object",
    "broadcast_object_list",
)


def _tensors(args, kwargs) -> list[torch.Tensor]:
    out = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out += [t for t in a if isinstance(t, torch.Tensor)]
    return out


def record_collectives(calls: list) -> list:
    """Replace torch.distributed's collectives by wrappers appending ``(name, [device of each tensor argument])``
    to ``calls``; returns what to put back (:func:`restore_collectives`)."""
    saved = []
    for name in COLLECTIVES:
        real = getattr(dist, name)

        def wrapper(*args, _real=real, _name=name, **kwargs):
            calls.append((_name, [t.device for t in _tensors(args, kwargs)]))
            return _real(*args, **kwargs)

        saved.append((name, real))
        setattr(dist, name, wrapper)
    return saved


def restore_collectives(saved: list) -> None:
    for name, real in saved:
        setattr(dist, name, real)


# ----------------------------------------------------------------------------------------------------------------
# What each spawned rank runs (module level: torch.multiprocessing pickles it by name)
# ----------------------------------------------------------------------------------------------------------------


def _helper_values(parallel) -> dict:
    from harness.training.loop import Window

    rank = parallel.rank
    bad = [parallel.bad_ranks(*flags[rank]) for flags, _ in BAD_CASES]
    # Rank 0's window had no successful step (its sums are the CPU zeros a Window starts with); rank 1's had one.
    window = (
        Window(3)
        if rank == 0
        else Window(3, torch.tensor([0.5, 2.0, 4.0]), torch.tensor([1.0, 2.0, 8.0]), real_tokens=11, padded_tokens=16)
    )
    parallel.sum_window(window)
    summed = (
        window.loss_sum.tolist(),
        window.token_count.tolist(),
        window.real_tokens,
        window.padded_tokens,
        window.loss_sum.dtype,
    )
    # Unequal token counts per rank: rank 0 holds 3 supervised tokens, rank 1 holds 5.
    n = 3 if rank == 0 else 5
    per_token = torch.arange(1.0, n + 1) * (rank + 1)
    weights = torch.linspace(0.5, 2.0, n)
    terms = {
        "weighted": float(parallel.global_mean(per_token, weights)),
        "plain": float(parallel.global_mean(per_token, None)),
    }
    return {"bad": bad, "window": summed, "terms": terms, "per_token": per_token.tolist(), "weights": weights.tolist()}


def _loop_collectives(parallel) -> dict:
    """A real two-rank training stage (tiny Qwen2, non-finite guard on, rank 1's forward made NaN at step 2 and
    skipped, a log every step, so step 2's window has no successful step), every collective recorded."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from harness.config import NonFiniteSpec
    from harness.data.batches import Batch
    from harness.training.guard import Injector, NonFiniteError
    from harness.training.loop import StageLoop, train_stage

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
    batches = []
    for _ in range(4):
        ids = torch.randint(0, 64, (4, 6))
        labels = torch.full_like(ids, -100)
        labels[:, 3:] = ids[:, 3:]
        batches.append(Batch(ids, torch.ones_like(ids), labels, ["a", "a", "a", "b"], 24, 24))
    rows, calls = [], []

    def stage(action: str):
        return train_stage(
            model,
            batches,
            StageLoop(
                "s",
                0,
                ["a", "b"],
                lambda r, step: rows.extend(r),
                lambda step: None,
                log_every=1,
                nonfinite=NonFiniteSpec(action=action),
                injector=Injector(step=2, where="forward", module=r"layers\.0\.mlp$", rank=1),
            ),
        )

    saved = record_collectives(calls)
    try:
        stage("skip_step")
        try:  # the same NaN under nonfinite: stop: every rank stops with rank 1's report
            stage("stop")
            stopped = None
        except NonFiniteError as e:
            stopped = e.report
    finally:
        restore_collectives(saved)
    return {
        "calls": calls,
        "model_device": next(model.parameters()).device,
        "hooks_device": getattr(parallel, "device", None),
        "stopped": stopped,
        "rows": [(r.step, r.metric, r.task, r.value) for r in rows],
    }


def _steering_collectives(parallel) -> dict:
    """An adaptive stage resumed on two ranks, each with its own partial sums, whose first step after the resume was
    skipped: the update all-reduces the resumed sums (no ``add`` since), every collective recorded."""
    from harness.training.steering import Steering
    from tests.training.test_collective_devices import StubStream

    parallel.trained_module(torch.nn.Linear(2, 2), "fp32")  # the hooks' device, as at a stage's start
    rank, stream, calls = parallel.rank, StubStream(), []
    state = {"loss_sum": [1.0 + rank, 4.0 * rank], "token_count": [1.0, 2.0 * rank]}
    steering = Steering(stream, ["a", "b"], "s", parallel, parallel.device, state)
    saved = record_collectives(calls)
    try:
        steering.after_step(0, 1)
    finally:
        restore_collectives(saved)
    return {"calls": calls, "observed": stream.observed, "hooks_device": parallel.device}


class FakeDeviceGenerator:
    """Stands in for this rank's CUDA generator (none on a CPU machine): a CPU generator per rank."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)

    def state(self):
        return self.generator.get_state()

    def set_state(self, state) -> None:
        if state is not None:
            self.generator.set_state(state)

    def draw(self) -> list[float]:
        return torch.rand(3, generator=self.generator).tolist()


def _seed_all(seed: int, device: FakeDeviceGenerator) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    device.generator.manual_seed(seed + 1)


def _draw_all(device: FakeDeviceGenerator) -> dict:
    return {
        "torch": torch.rand(3).tolist(),
        "numpy": np.random.rand(3).tolist(),
        "python": [random.random() for _ in range(3)],
        "device": device.draw(),
    }


def _resume_generators(parallel, root: Path) -> dict:
    """Each rank seeds its four generators differently, a resume point is written at that moment, the ranks draw
    (the uninterrupted run), the generators are scrambled, and the resume point's states are restored: the draws
    must repeat, rank by rank."""
    from harness.training import rng
    from harness.training.checkpoint import latest_resume_point, resume_start, save_resume_point
    from harness.training.loop import LoopState

    device = FakeDeviceGenerator(0)
    rng.device_state, rng.set_device_state = device.state, device.set_state  # this rank's "CUDA" generator
    _seed_all(100 + parallel.rank, device)
    _draw_all(device)  # not at their seeds any more
    save_resume_point(root / "run", torch.nn.Linear(2, 2), 0, "a", 5, LoopState(5, 0, None, {}, {}), keep=2)
    uninterrupted = _draw_all(device)
    _seed_all(999, device)
    dist.barrier()  # rank 0 has written the resume point
    start = resume_start(latest_resume_point(root / "run"), [SimpleNamespace(name="a")], [10])
    start.weights.restore_rng()
    return {"uninterrupted": uninterrupted, "resumed": _draw_all(device)}


def _stage_cache_generators(parallel, root: Path) -> dict:
    """The stage cache's entry from two ranks whose device generators differ: replayed, each rank's device
    generator continues from its own state (rank 0 writes the entry; every rank reads it)."""
    from harness.runs.execution.stage_cache import StageCache, _rng_states, _set_global_rng
    from harness.training import rng

    device = FakeDeviceGenerator(0)
    rng.device_state, rng.set_device_state = device.state, device.set_state
    torch.manual_seed(5)  # the torch CPU states agree (the entry holds one), the device generators do not
    device.generator.manual_seed(200 + parallel.rank)
    cache = StageCache("exp", [], [], root, "run", SimpleNamespace(info=lambda line: None), root=root / "stages")
    stores, device_states = cache._rank_zero_stores("a")
    entry = root / "entry"
    if stores:
        entry.mkdir()
        tensors, states = _rng_states(device_states)
        torch.save(tensors, entry / "rng.pt")
        (entry / "rng.json").write_text(json.dumps(states))
    dist.barrier()
    uninterrupted = device.draw()
    device.generator.manual_seed(999)
    _set_global_rng(entry)
    return {"stores": stores, "uninterrupted": uninterrupted, "replayed": device.draw()}


def _image_model_and_batch():
    """A tiny llava-tiny and a mixed batch whose images are all in rows 0 and 1 (rank 1's half has none)."""
    import data_recipes as recipes
    from harness.data.images import collate_mixed, encode_image_examples
    from harness.models.image_text import build_llava_tiny
    from harness.models.tokenizer import train_tokenizer

    qa = recipes.get_recipe("shapes_qa")().build("shapes_qa", 40, 4, 0)
    count = recipes.get_recipe("count")().build("count", 40, 4, 0)
    texts = [f"{m['role']}\n{m['content']}" for ex in qa["train"] + count["train"] for m in ex.messages]
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    model, processor = build_llava_tiny(train_tokenizer(texts, 300), 0, text_overrides=text, vision_overrides=vision)
    rows = [qa["train"][0], qa["train"][1], count["train"][0], count["train"][1]]
    return model, collate_mixed(encode_image_examples(processor, rows), processor.tokenizer.pad_token_id)


def _image_batch_gradients(parallel) -> dict:
    """Two DDP steps' worth of backward on an image batch through the loop's loss: the vision tower and projector
    get no gradient on rank 1 (no image in its slice), which DDP must accept; the averaged gradients of the
    projector after the first backward, to compare with one process on the whole batch."""
    from harness.config import LossSpec
    from harness.training.loop import batch_loss

    model, batch = _image_model_and_batch()
    parallel.trained_module(model, "fp32")  # the hooks' device, as at a stage's start
    part = parallel.shard(batch)
    grads = None
    for _ in range(2):  # a second forward is where DDP complains about parameters the first left without gradient
        loss, _, _ = batch_loss(
            model, part, LossSpec(), torch.zeros(len(part.tasks), dtype=torch.long), ["t"], "fp32", parallel=parallel
        )
        loss.backward()
        if grads is None:
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if "projector" in n}
        model.zero_grad(set_to_none=True)
    return {"has_pixels": part.pixel_values is not None, "projector_grads": grads}


SCENARIOS = {
    "helpers": _helper_values,
    "loop": _loop_collectives,
    "image": _image_batch_gradients,
    "steering": _steering_collectives,
    "resume": _resume_generators,
    "stage_cache": _stage_cache_generators,
}


def _rank_main(rank: int, root: Path) -> None:
    """Every scenario on this rank; one that raises leaves its traceback as its result (each test then fails on
    its own scenario, and the others still run)."""
    import datetime
    import traceback

    from harness.training.parallel import ddp

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{root / 'store'}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=120),
    )
    out = {}
    try:
        with ddp.active() as parallel:
            for name, scenario in SCENARIOS.items():
                try:
                    one_arg = name in ("helpers", "loop", "image", "steering")
                    out[name] = scenario(parallel) if one_arg else scenario(parallel, root)
                except Exception:
                    out[name] = {"error": traceback.format_exc()}
    finally:
        dist.destroy_process_group()
    torch.save(out, root / f"rank{rank}.pt")


def _result(rank: dict, scenario: str) -> dict:
    assert "error" not in rank[scenario], rank[scenario].get("error")
    return rank[scenario]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Two gloo ranks run every scenario above once; their results, in rank order."""
    import torch.multiprocessing as mp

    root = tmp_path_factory.mktemp("collectives")
    mp.spawn(_rank_main, args=(root,), nprocs=WORLD, join=True)
    return [torch.load(root / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


# ----------------------------------------------------------------------------------------------------------------
# The helpers' values on two ranks
# ----------------------------------------------------------------------------------------------------------------


def test_image_batches_train_on_two_ranks_as_in_one_process(ranks):
    """A rank whose slice holds no image still steps (DDP finds the vision parameters unused there), and the
    projector's averaged gradient is one process's on the whole batch."""
    from harness.config import LossSpec
    from harness.training.loop import batch_loss

    results = [_result(rank, "image") for rank in ranks]
    assert [r["has_pixels"] for r in results] == [True, False]
    model, batch = _image_model_and_batch()
    loss, _, _ = batch_loss(model, batch, LossSpec(), torch.zeros(len(batch.tasks), dtype=torch.long), ["t"])
    loss.backward()
    for name, grad in results[0]["projector_grads"].items():
        reference = dict(model.named_parameters())[name].grad
        assert torch.equal(grad, results[1]["projector_grads"][name])  # DDP's average is every rank's
        # the sum of two ranks' partial sums vs one sum over the batch: float32 rounding over the batch's tokens,
        # not a measured tolerance
        bound = batch.supervised.numel() * torch.finfo(torch.float32).eps * reference.abs().max()
        assert (grad - reference).abs().max() <= bound, name


def test_bad_ranks_names_where_a_nonfinite_step_began_on_every_rank(ranks):
    for r in ranks:
        assert _result(r, "helpers")["bad"] == [expected for _, expected in BAD_CASES]


def test_sum_window_sums_over_ranks_also_a_window_without_a_successful_step(ranks):
    for r in ranks:
        loss_sum, token_count, real, padded, dtype = _result(r, "helpers")["window"]
        assert loss_sum == [0.5, 2.0, 4.0] and token_count == [1.0, 2.0, 8.0]
        assert (real, padded, dtype) == (11, 16, torch.float32)


def test_global_mean_terms_add_up_to_the_global_weighted_mean(ranks):
    """Each rank's term is its Σ w·l over the global Σ w, times the world size: DDP averages the ranks' gradients,
    so the mean of the terms is the one-process weighted mean of all tokens (not the mean of per-rank means)."""
    helpers = [_result(r, "helpers") for r in ranks]
    per_token = [x for h in helpers for x in h["per_token"]]
    weights = [x for h in helpers for x in h["weights"]]
    weighted = sum(w * x for w, x in zip(weights, per_token)) / sum(weights)
    plain = sum(per_token) / len(per_token)
    assert sum(h["terms"]["weighted"] for h in helpers) / WORLD == pytest.approx(weighted, rel=1e-6)
    assert sum(h["terms"]["plain"] for h in helpers) / WORLD == pytest.approx(plain, rel=1e-6)
    means_of_ranks = sum(sum(h["per_token"]) / len(h["per_token"]) for h in helpers) / WORLD
    assert abs(means_of_ranks - plain) > 0.1  # the case tells the two apart


# ----------------------------------------------------------------------------------------------------------------
# Every tensor a collective is handed lives on the model's device
# ----------------------------------------------------------------------------------------------------------------


def test_a_training_stage_hands_collectives_only_tensors_on_the_models_device(ranks):
    """The real loop on two ranks (non-finite guard on, a skipped step, so a window without a successful step is
    summed): the recorder saw the hooks' all-reduces, and every tensor handed to a collective was on the model's
    device, which is the hooks' device. On a CPU this is the coverage half; the meta tests
    (tests/training/test_collective_devices.py) are the half that tells devices apart."""
    for r in ranks:
        loop = _result(r, "loop")
        assert loop["hooks_device"] == loop["model_device"]
        names = [name for name, _ in loop["calls"]]
        # per step: global_mean's token total and bad_ranks' flags; per log step: sum_window's one packed tensor
        assert names.count("all_reduce") >= 3 * 4, names
        assert "broadcast_object_list" in names, "the skipped step's report went from rank 1 to every rank"
        assert all(d == loop["model_device"] for _, devices in loop["calls"] for d in devices), loop["calls"]
        steps = {(step, metric) for step, metric, task, _ in loop["rows"] if task is None}
        assert (2, "nonfinite_skip") in steps and (2, "loss") not in steps and (3, "loss") in steps
        stopped = loop["stopped"]  # the report as rank 1 saw it, on both ranks
        assert stopped is not None and (stopped["rank"], stopped["step"], stopped["what"]) == (1, 2, "loss")
        assert stopped["first_module"] == "model.layers.0.mlp", stopped


def test_a_resumed_adaptive_update_sums_every_ranks_partial_sums_on_the_hooks_device(ranks):
    """Rank 0 resumed with loss sums (a=1, b=0) over counts (1, 0), rank 1 with (2, 4) over (1, 2): both observe the
    per-task means of the sums over ranks, in the stream's task order (b, a), reduced on the hooks' device."""
    for r in ranks:
        steering = _result(r, "steering")
        assert steering["observed"] == [[4.0 / 2.0, 3.0 / 2.0]]
        assert [name for name, _ in steering["calls"]] == ["all_reduce"]
        assert all(d == steering["hooks_device"] for _, devices in steering["calls"] for d in devices)


# ----------------------------------------------------------------------------------------------------------------
# Each rank's own random generators
# ----------------------------------------------------------------------------------------------------------------


def test_a_resume_point_gives_every_rank_back_its_own_generators(ranks):
    """torch CPU, the rank's device generator, numpy and Python: after the restore each rank draws what it would
    have drawn uninterrupted (and the two ranks' draws differ, so rank 0's states would not do)."""
    for r in ranks:
        assert _result(r, "resume")["resumed"] == _result(r, "resume")["uninterrupted"]
    for name in ("torch", "numpy", "python", "device"):
        assert (
            _result(ranks[0], "resume")["uninterrupted"][name] != _result(ranks[1], "resume")["uninterrupted"][name]
        ), name


def test_a_stage_cache_entry_gives_every_rank_back_its_own_device_generator(ranks):
    assert [_result(r, "stage_cache")["stores"] for r in ranks] == [True, False]  # rank 0 alone writes
    for r in ranks:
        assert _result(r, "stage_cache")["replayed"] == _result(r, "stage_cache")["uninterrupted"]
    assert _result(ranks[0], "stage_cache")["uninterrupted"] != _result(ranks[1], "stage_cache")["uninterrupted"]


def test_the_gpu_check_says_it_skipped_without_cuda():
    """bench/gpu_check.py runs the harness's commands on GPUs; without CUDA it checks nothing and says so (exit 0)."""
    from tests.conftest import ROOT

    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no CUDA device visible — skipped, nothing was checked" in done.stdout
