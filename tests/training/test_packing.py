"""``train.packing``: packed batches hold the same examples as the padded ones, give the same losses and gradients
with every loss option, and the exactness check passes on every architecture that honours transformers'
padding-free format and catches those that do not (qwen3_5's linear attention, learned positions fed the row's
positions) — naming what leaked."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from harness.config import LossSpec, ModelSpec, load_experiment
from harness.data.batches import collate
from harness.data.encoding import IGNORE_INDEX, encode_examples
from harness.data.packed_batches import balanced_rows, examples_of, pack_encoded, repacked
from harness.models.builtin import build_builtin
from harness.models.hf import load_hf
from harness.training.loop import batch_loss
from harness.training.packing_check import PackingCheck, check_packing, relative_loss_diff
from harness.training.special_tokens import _read_token_ids
from tests.conftest import write_yaml
from tests.models.test_architectures import SMALL, _example, local_gpt2, tok  # noqa: F401 (fixtures)

TASKS = ["repeat", "other"]


def _varied(i: int):
    """Examples of different lengths and two tasks (so task weights and per-example reduction matter)."""
    example = _example(i)
    if i % 3 == 0:
        example.messages[1]["content"] = " ".join([example.messages[1]["content"]] * 3)
    example.task = TASKS[i % 2]
    return example


@pytest.fixture(scope="module")
def groups(tok):  # noqa: F811
    encoded = encode_examples(tok, [_varied(i) for i in range(24)])
    return [encoded[i : i + 8] for i in range(0, 24, 8)]


def test_packed_batch_holds_the_same_examples_with_restarting_positions(tok, groups):  # noqa: F811
    padded, packed = collate(groups[0], tok.pad_token_id), pack_encoded(groups[0], tok.pad_token_id, factor=2)
    assert packed.packed and not padded.packed
    assert packed.tasks == padded.tasks and packed.n_real_tokens == padded.n_real_tokens
    assert packed.n_padded_tokens < padded.n_padded_tokens  # less padding (the point)
    assert packed.input_ids.shape[0] < padded.input_ids.shape[0]
    for (ids, labels), e in zip(examples_of(packed), groups[0]):
        assert np.array_equal(ids, e.input_ids) and np.array_equal(labels, e.labels)
    for row, start, n in packed.layout.spans:
        assert packed.position_ids[row, start : start + n].tolist() == list(range(n))
    # the supervised tokens come in the padded batch's order: the same targets, the same examples
    assert torch.equal(packed.labels.flatten()[packed.supervised], padded.labels.flatten()[padded.supervised])
    assert torch.equal(packed.example_of_token, padded.example_of_token)
    one_row = pack_encoded(groups[0], tok.pad_token_id, factor=None)
    assert one_row.input_ids.shape[0] == 1 and one_row.n_padded_tokens == one_row.n_real_tokens


def test_balanced_rows_spread_examples_evenly():
    lengths = [30, 10, 22, 17, 25, 9, 14, 28]
    rows = balanced_rows(lengths, 3)
    assert sorted(i for row in rows for i in row) == list(range(8))
    filled = [sum(lengths[i] for i in row) for row in rows]
    assert max(filled) - min(filled) <= min(lengths)  # LPT: the rows differ by at most one short example
    assert all(row == sorted(row) for row in rows)  # sampler order within a row


LOSSES = {
    "ce": LossSpec(),
    "first_token_weight": LossSpec(first_token_weight=3.0),
    "task_weights": LossSpec(task_weights={"other": 0.25}),
    "reduction_example": LossSpec(reduction="example", first_token_weight=2.0),
    "gem": LossSpec(name="gem", beta=0.7),
}


# (row factor, varlen): masked rows of 2x the longest example; one row attended example by example
LAYOUTS = {"masked": (2, False), "varlen": (None, True)}


@pytest.mark.parametrize("layout", [*LAYOUTS, "varlen, a block per length"])
@pytest.mark.parametrize("name", list(LOSSES))
def test_packed_loss_and_gradient_equal_the_padded_ones(tok, groups, name, layout, monkeypatch):  # noqa: F811
    from harness.data import segments

    model = build_builtin(ModelSpec(builtin="qwen2-tiny", config=SMALL["qwen2-tiny"]), tok, seed=0)
    spec = LOSSES[name]
    outcomes = []
    factor, varlen = LAYOUTS.get(layout, LAYOUTS["varlen"])
    if layout == "varlen, a block per length":  # the gather, offsets and scatter of several blocks
        monkeypatch.setattr(segments, "BLOCK_OVERHEAD_PAIRS", 0)  # read when the batch is packed
    packed = pack_encoded(groups[1], tok.pad_token_id, factor, varlen)
    if layout == "varlen, a block per length":
        assert len(packed.segments.blocks) > 1
    for batch in (collate(groups[1], tok.pad_token_id), packed):
        task_ids = torch.tensor([TASKS.index(t) for t in batch.tasks])
        loss, ce, task_of_token = batch_loss(model, batch, spec, task_ids, TASKS)
        loss.backward()
        grad = model.get_input_embeddings().weight.grad.clone()
        model.zero_grad(set_to_none=True)
        outcomes.append((loss.detach(), ce, task_of_token, grad))
    (loss_a, ce_a, tasks_a, grad_a), (loss_b, ce_b, tasks_b, grad_b) = outcomes
    assert torch.equal(tasks_a, tasks_b)
    assert torch.allclose(ce_a, ce_b, rtol=1e-5, atol=0)
    assert torch.allclose(loss_a, loss_b, rtol=1e-6, atol=0)
    assert ((grad_a - grad_b).norm() / grad_a.norm()).item() < 1e-5


def test_packed_rows_read_only_their_own_examples_tokens(tok, groups):  # noqa: F811
    """The special-token gradient check's "tokens read before a supervised position": the same set packed (a
    row's earlier example does not count as read by the later example's supervised tokens)."""
    padded, packed = collate(groups[2], tok.pad_token_id), pack_encoded(groups[2], tok.pad_token_id, factor=None)
    assert _read_token_ids(packed) == _read_token_ids(padded)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", list(SMALL))
def test_the_check_on_every_builtin(tok, groups, name, layout):  # noqa: F811
    model = build_builtin(ModelSpec(builtin=name, config=SMALL[name]), tok, seed=0)
    padded = [collate(g, tok.pad_token_id) for g in groups]
    packed = [pack_encoded(g, tok.pad_token_id, *LAYOUTS[layout]) for g in groups]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = check_packing(model, padded, packed, LossSpec(), TASKS)
    assert model.training and all(p.grad is None for p in model.parameters())  # left as it was
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert result.noise < result.tolerance and result.floor > 0
    if name == "qwen3_5-tiny":  # Gated DeltaNet and its convolution carry state across the row's examples
        assert not result.exact and result.leaked == "attention"
        assert "qwen3_5_text" in result.why() and "attention" in result.why()
    else:
        assert result.exact and result.leaked is None, result


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_check_on_a_local_hf_gpt2_with_learned_positions(local_gpt2, groups, tok, layout):  # noqa: F811
    directory, _ = local_gpt2
    model, tokenizer, _ = load_hf(ModelSpec(hf=str(directory)), return_added=True)
    encoded = encode_examples(tokenizer, [_varied(i) for i in range(16)])
    padded = [collate(encoded[i : i + 8], tokenizer.pad_token_id) for i in (0, 8)]
    packed = [pack_encoded(encoded[i : i + 8], tokenizer.pad_token_id, *LAYOUTS[layout]) for i in (0, 8)]
    assert check_packing(model, padded, packed, LossSpec(), TASKS).exact

    class RowPositions(torch.nn.Module):
        """A broken model: learned positions looked up by the position in the row (the mask is still right)."""

        def __init__(self, wpe):
            super().__init__()
            self.wpe = wpe

        def forward(self, position_ids):
            return self.wpe(torch.arange(position_ids.shape[-1]).expand_as(position_ids))

    model.transformer.wpe = RowPositions(model.transformer.wpe)
    result = check_packing(model, padded, packed, LossSpec(), TASKS)
    assert not result.exact and result.leaked == "positions", result
    assert result.max_rel_diff > 100 * result.tolerance


def test_a_forward_with_a_cache_is_caught(tok, groups, monkeypatch):  # noqa: F811
    """transformers turns off its packed-sequence detection when a cache is passed: attention then crosses the
    row's examples. Caught, and named."""
    from harness.training import forward

    model = build_builtin(ModelSpec(builtin="llama-tiny", config=SMALL["llama-tiny"]), tok, seed=0)
    monkeypatch.setattr(
        forward,
        "model_inputs",
        lambda ids, mask, positions=None: (
            {"input_ids": ids, "attention_mask": mask}
            if positions is None
            else {"input_ids": ids, "position_ids": positions, "use_cache": True}
        ),
    )
    padded = [collate(g, tok.pad_token_id) for g in groups]
    packed = [pack_encoded(g, tok.pad_token_id) for g in groups]
    result = check_packing(model, padded, packed, LossSpec(), TASKS)
    assert not result.exact and result.leaked == "attention"


def test_varlen_attention_that_lets_examples_see_each_other_is_caught(tok, groups, monkeypatch):  # noqa: F811
    """A planted bug in example-by-example attention: the plan treats the whole row as one example (positions
    still restart). The check must name attention, not pass it."""
    from harness.data import packed_batches, segments

    def one_segment(position_ids):
        return segments.segment_plan(torch.arange(position_ids.numel()).view_as(position_ids))

    model = build_builtin(ModelSpec(builtin="qwen2-tiny", config=SMALL["qwen2-tiny"]), tok, seed=0)
    padded = [collate(g, tok.pad_token_id) for g in groups]
    packed = [pack_encoded(g, tok.pad_token_id, None, True) for g in groups]
    assert check_packing(model, padded, packed, LossSpec(), TASKS).exact
    monkeypatch.setattr(packed_batches, "segment_plan", one_segment)  # the plan is made when the batch is packed
    packed = [pack_encoded(g, tok.pad_token_id, None, True) for g in groups]
    result = check_packing(model, padded, packed, LossSpec(), TASKS)
    assert not result.exact and result.leaked == "attention", result


def test_example_by_example_attention_is_not_offered_where_it_cannot_serve(tok):  # noqa: F811
    from harness.models.packed_attention import can_replace

    model = build_builtin(ModelSpec(builtin="qwen2-tiny", config=SMALL["qwen2-tiny"]), tok, seed=0)
    assert can_replace(model)
    # the backward's recomputation would attend across the whole row (transformers >= 5.x names it "activation")
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    assert not can_replace(model)
    (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()
    assert can_replace(model)
    model.forward = lambda input_ids, position_ids=None: None  # no **kwargs: the plan could not reach attention
    assert not can_replace(model)


def test_the_plan_is_made_when_packed_and_the_forward_uses_the_batch_s_plan(tok, groups):  # noqa: F811
    """The attention plan is made on the host when a batch is packed and moves with it: a forward that planned
    from the positions would read them back from the GPU at every step (a device-to-host sync)."""
    from dataclasses import replace

    from harness.data.segments import segment_plan

    packed = pack_encoded(groups[0], tok.pad_token_id, None, True)
    assert packed.segments is not None and packed.segments.tokens == packed.input_ids.numel()
    assert pack_encoded(groups[0], tok.pad_token_id, 2, False).segments is None  # masked rows attend by the mask
    moved = packed.to("meta")
    assert moved.segments.source.device.type == "meta"
    assert all(block.gather.device.type == "meta" for block in moved.segments.blocks)
    # the forward reads the batch's plan: given one that makes each row a single example, the losses change
    model = build_builtin(ModelSpec(builtin="qwen2-tiny", config=SMALL["qwen2-tiny"]), tok, seed=0)
    whole_rows = segment_plan(torch.arange(packed.input_ids.numel()).view_as(packed.input_ids))
    task_ids = torch.tensor([TASKS.index(t) for t in packed.tasks])
    with torch.no_grad():
        _, own, _ = batch_loss(model, packed, LossSpec(), task_ids, TASKS)
        _, other, _ = batch_loss(model, replace(packed, segments=whole_rows), LossSpec(), task_ids, TASKS)
    assert not torch.allclose(own, other)


@pytest.mark.parametrize("overhead", [100, 16384])
def test_segment_plan_covers_every_token_once_in_blocks_of_similar_length(overhead, monkeypatch):
    from harness.data import segments
    from harness.data.segments import _blocks_of, segment_plan

    monkeypatch.setattr(segments, "BLOCK_OVERHEAD_PAIRS", overhead)
    lengths = [7, 30, 3, 12, 30, 5, 21, 9]
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    plan = segment_plan(positions)
    assert (len(plan.blocks) > 1) == (overhead == 100)  # a small overhead cuts blocks; the default does not here
    assert plan.tokens == sum(lengths)
    flat = torch.cat([b.gather for b in plan.blocks])
    assert torch.equal(flat[plan.source], torch.arange(sum(lengths)))  # every token's output comes from itself
    assert sum(b.n for b in plan.blocks) == len(lengths)
    # every block's width is its longest example, and the blocks are the cheapest cut (brute force over cuts)
    ordered = sorted(lengths, reverse=True)
    runs = _blocks_of(ordered)
    assert [b.length for b in plan.blocks] == [ordered[lo] for lo, _ in runs]

    def cost(cuts):
        bounds = [0, *cuts, len(ordered)]
        return sum((hi - lo) * ordered[lo] ** 2 + overhead for lo, hi in zip(bounds, bounds[1:]))

    from itertools import combinations

    best = min(cost(c) for k in range(8) for c in combinations(range(1, len(ordered)), k))
    assert cost([lo for lo, _ in runs[1:]]) == best
    # a row's padded tail restarts its positions too: a segment of its own
    two_rows = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]])
    assert sum(b.n for b in segment_plan(two_rows).blocks) == 6


def test_tolerance_comes_from_the_measured_noise_and_the_rounding_floor():
    check = PackingCheck("x", max_rel_diff=1e-6, noise=3e-7, floor=1e-7)
    assert check.tolerance == pytest.approx(4 * 3e-7) and check.exact
    assert PackingCheck("x", 1e-6, noise=0.0, floor=1e-7).tolerance == pytest.approx(4e-7)


def test_an_example_the_model_already_fits_does_not_raise_a_false_alarm():
    """Rounding moves a loss by an absolute amount set by the logits, not by the loss: on an example with a loss
    near 0 that same rounding is measured against the batch's loss scale, while a real leak still shows."""
    padded = torch.tensor([2.0, 1.5, 1e-5], dtype=torch.float64)
    rounding = torch.tensor([2e-7, -1.5e-7, 1e-7], dtype=torch.float64)  # float32-sized absolute errors
    assert relative_loss_diff(padded + rounding, padded) < 2e-7  # the fitted example alone would say 1e-2
    leaked = padded.clone()
    leaked[1] += 0.01
    assert relative_loss_diff(leaked, padded) > 1e-3


def _shards(batch, world):
    from harness.training.parallel.ddp import DataParallel

    out = []
    for rank in range(world):
        hooks = DataParallel.__new__(DataParallel)  # the hooks without a process group
        hooks.rank, hooks.world = rank, world
        out.append(hooks.shard(batch))
    return out


def _same_examples(shards, batch):
    pairs = sorted((t, a.tobytes(), b.tobytes()) for s in shards for t, (a, b) in zip(s.tasks, examples_of(s)))
    return pairs == sorted((t, a.tobytes(), b.tobytes()) for t, (a, b) in zip(batch.tasks, examples_of(batch)))


def test_ranks_take_whole_rows_of_a_packed_batch(tok, groups):  # noqa: F811
    """Each rank computes its rows exactly as one process does: the same rows, the same width, the same
    per-token losses."""
    model = build_builtin(ModelSpec(builtin="qwen2-tiny", config=SMALL["qwen2-tiny"]), tok, seed=0)
    packed = pack_encoded(groups[0], tok.pad_token_id, factor=1)
    assert packed.input_ids.shape[0] >= 2
    shards = _shards(packed, 2)
    assert all(s.packed and s.input_ids.shape[1] == packed.input_ids.shape[1] for s in shards)
    assert _same_examples(shards, packed)
    assert sum(s.supervised.numel() for s in shards) == packed.supervised.numel()

    def token_losses(batch, first_row=0):  # {(row in the whole batch, position): CE}
        task_ids = torch.tensor([TASKS.index(t) for t in batch.tasks])
        _, ce, _ = batch_loss(model, batch, LossSpec(), task_ids, TASKS)
        width = batch.input_ids.shape[1]
        return {(int(f) // width + first_row, int(f) % width): v for f, v in zip(batch.supervised, ce.tolist())}

    with torch.no_grad():
        whole = token_losses(packed)
        parts = {**token_losses(shards[0]), **token_losses(shards[1], shards[0].input_ids.shape[0])}
    assert whole.keys() == parts.keys()
    assert all(abs(whole[k] - parts[k]) <= 1e-6 * abs(whole[k]) for k in whole)


def test_a_packed_batch_with_fewer_rows_than_ranks_is_sliced_by_example(tok, groups):  # noqa: F811
    packed = pack_encoded(groups[0], tok.pad_token_id, factor=None)  # one row
    shards = _shards(packed, 3)
    assert all(s.packed for s in shards)
    assert [t for s in shards for t in s.tasks] == packed.tasks  # contiguous slices, in sampler order
    assert _same_examples(shards, packed)
    assert examples_of(repacked(packed, 2, 5))[0][0].tolist() == groups[0][2].input_ids.tolist()
    assert all((s.labels.flatten()[s.supervised] != IGNORE_INDEX).all() for s in shards)


# ----------------------------------------------------------------------------------------------------------------
# In a run
# ----------------------------------------------------------------------------------------------------------------


def _run(tmp_path, data, name):
    from harness.core.store import read_metrics
    from harness.runs.execution.runner import run_experiment

    exp = load_experiment(write_yaml(tmp_path / f"{name}.yaml", data))
    run_experiment(exp, tmp_path / name)
    return read_metrics(tmp_path / name)


def _values(frame, metric):
    rows = frame.filter((frame["metric"] == metric) & frame["task"].is_null()).sort(["step", "stage"])
    return rows["value"].to_list()


def test_a_run_packs_by_default_and_trains_as_padded(tiny, tmp_path):
    tiny["train"]["log_every"] = 1
    packed = _run(tmp_path, tiny, "packed")
    assert _values(packed, "packed") == [1.0, 1.0]  # both stages checked, both packed
    assert _values(packed, "packing_varlen") == [1.0, 1.0]  # example by example: one row, no mask
    diffs, tolerances = _values(packed, "packing_max_rel_diff"), _values(packed, "packing_tolerance")
    assert all(d <= t for d, t in zip(diffs, tolerances))
    tiny["train"]["packing"] = False
    padded = _run(tmp_path, tiny, "padded")
    assert _values(padded, "packed") == []  # false: no check
    a, b = np.array(_values(packed, "loss")), np.array(_values(padded, "loss"))
    assert len(a) == 8 and np.allclose(a, b, rtol=1e-5, atol=0)
    assert np.mean(_values(packed, "pad_fraction")) < np.mean(_values(padded, "pad_fraction"))


def test_auto_pads_a_model_that_leaks_with_one_warning(tiny, tmp_path, caplog):
    tiny["model"] = {"builtin": "qwen3_5-tiny", "config": SMALL["qwen3_5-tiny"], "tokenizer": {"vocab_size": 400}}
    tiny["stages"] = tiny["stages"][:1]
    with caplog.at_level(logging.WARNING, logger="harness.runs.execution.packing_decision"):
        frame = _run(tmp_path, tiny, "hybrid")
    warnings = [r.getMessage() for r in caplog.records if r.name == "harness.runs.execution.packing_decision"]
    assert len(warnings) == 1 and "qwen3_5_text" in warnings[0] and "attention" in warnings[0]
    assert _values(frame, "packed") == [0.0]
    assert _values(frame, "packing_max_rel_diff")[0] > _values(frame, "packing_tolerance")[0]
    assert _values(frame, "pad_fraction")[0] > 0  # trained padded


def test_attention_varlen_cannot_do_falls_back_to_masked_rows(tiny, tmp_path):
    """A sliding window (harness_varlen does not do one) packs through transformers' mask instead."""
    tiny["model"]["config"] = {
        **tiny["model"]["config"],
        "num_hidden_layers": 2,
        "use_sliding_window": True,
        "sliding_window": 4,
        "max_window_layers": 1,
    }  # the second layer slides
    tiny["stages"] = tiny["stages"][:1]
    frame = _run(tmp_path, tiny, "window")
    assert _values(frame, "packed") == [1.0] and _values(frame, "packing_varlen") == [0.0]


def test_packing_true_on_a_model_that_leaks_exits_2(tiny, tmp_path):
    from tests.conftest import run_cli

    tiny["model"] = {"builtin": "qwen3_5-tiny", "config": SMALL["qwen3_5-tiny"], "tokenizer": {"vocab_size": 400}}
    tiny["stages"] = tiny["stages"][:1]
    tiny["train"]["packing"] = True
    result = run_cli("run", str(write_yaml(tmp_path / "hybrid.yaml", tiny)), "--out", str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert "qwen3_5_text" in line and "attention" in line and "train.packing: true" in line


def test_packing_stays_out_of_dumps_unless_set(tiny, tmp_path):
    """Experiments that do not set train.packing keep their resolved config (and so their stage-cache keys)."""
    exp = load_experiment(write_yaml(tmp_path / "a.yaml", tiny))
    resolved = exp.resolved_dict()
    assert "packing" not in resolved["train"] and all("packing" not in s for s in resolved["stages"])
    assert exp.resolved_stages()[0].train.packing == "auto"
    tiny["stages"][1]["packing"] = False
    exp = load_experiment(write_yaml(tmp_path / "b.yaml", tiny))
    assert [s.get("packing") for s in exp.resolved_dict()["stages"]] == [None, False]
    tiny["train"]["packing"] = "sometimes"
    with pytest.raises(Exception, match="packing"):
        load_experiment(write_yaml(tmp_path / "c.yaml", tiny))


def test_image_batches_are_padded_and_packing_true_is_refused(tiny, tmp_path):
    from types import SimpleNamespace

    from harness.data.stage_batches import plan_stage
    from harness.data.task_data import DataError
    from harness.runs.execution.packing_decision import stage_batches
    from harness.runs.planning.prepare import stage_batching

    def example(i):
        ids = np.arange(5 + i % 3, dtype=np.int64)
        labels = np.concatenate([np.full(3, IGNORE_INDEX), ids[4:], [IGNORE_INDEX]])
        return SimpleNamespace(
            task="repeat",
            input_ids=ids,
            labels=labels,
            length=len(ids),
            n_supervised=int((labels != IGNORE_INDEX).sum()),
            pixel_values=np.zeros((3, 8, 8), dtype=np.float32),
        )

    pools = {"repeat": [example(i) for i in range(16)]}
    exp = load_experiment(write_yaml(tmp_path / "auto.yaml", tiny))
    plan = plan_stage(stage_batching(exp), exp.resolved_stages()[0], 0, pools, pad_id=0)
    assert plan.has_images
    rows = []
    assert stage_batches(plan, None, ["repeat"], 0, 0, lambda r, s: rows.extend(r)) is plan.batches
    assert rows == []  # no check: image batches are padded under auto
    tiny["train"]["packing"] = True
    exp = load_experiment(write_yaml(tmp_path / "true.yaml", tiny))
    with pytest.raises(DataError, match=r"stage 'a': train.packing: true, but its batches hold images"):
        plan_stage(stage_batching(exp), exp.resolved_stages()[0], 0, pools, pad_id=0)


def test_auto_pads_a_compiled_stage(tok, groups, tiny, tmp_path, monkeypatch):  # noqa: F811
    from harness.data.stage_batches import StagePlan
    from harness.runs.execution import packing_decision

    exp = load_experiment(write_yaml(tmp_path / "x.yaml", tiny))
    plan = StagePlan(exp.resolved_stages()[0], [collate(g, tok.pad_token_id) for g in groups], {}, groups)
    model = build_builtin(ModelSpec(builtin="qwen2-tiny", config=SMALL["qwen2-tiny"]), tok, seed=0)
    rows = []
    monkeypatch.setattr(packing_decision, "compile_decision", lambda setting, steps, device: True)
    assert (
        packing_decision.stage_batches(plan, model, TASKS, tok.pad_token_id, 0, lambda r, s: rows.extend(r))
        is plan.batches
    )
    assert rows == []
    monkeypatch.setattr(packing_decision, "compile_decision", lambda setting, steps, device: False)
    packed = packing_decision.stage_batches(plan, model, TASKS, tok.pad_token_id, 0, lambda r, s: rows.extend(r))
    assert all(b.packed and b.layout.varlen for b in packed)
    assert [r.metric for r in rows] == ["packing_max_rel_diff", "packing_tolerance", "packed", "packing_varlen"]


def test_two_ranks_train_packed_batches_like_one_process(tiny, tmp_path):
    """DDP on packed batches: each rank takes whole rows of the step's packed batch; the first stage's per-step
    losses equal one process's to float order (as for padded batches, tests/runs/test_distributed.py)."""
    from harness.core.store import read_metrics
    from tests.conftest import run_cli

    tiny["train"].update(batch_size=12, log_every=1, stage_cache=False)
    tiny["stages"] = [{"name": "a", "steps": 4, "mixture": {"repeat": 0.4, "yesno": 0.3, "math": 0.3}}]
    path = write_yaml(tmp_path / "x.yaml", tiny)
    env = {"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    for name, extra in (("one", []), ("two", ["--nproc", "2"])):
        result = run_cli("run", str(path), "--out", str(tmp_path / name), *extra, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
    one, two = (read_metrics(tmp_path / n) for n in ("one", "two"))
    assert _values(one, "packed") == _values(two, "packed") == [1.0]
    a, b = np.array(_values(one, "loss")), np.array(_values(two, "loss"))
    assert len(a) == 4 and np.allclose(a, b, rtol=1e-5, atol=0)
    assert np.allclose(_values(one, "pad_fraction"), _values(two, "pad_fraction"))  # the same rows, split


@pytest.mark.parametrize("trainable", ["lora", "hira"])
def test_adapters_train_packed(tiny, tmp_path, trainable):
    """The check runs on the stage's model, adapter included, and passes: LoRA and HiRA stages train packed."""
    tiny["train"].update(trainable=trainable, stage_cache=False)
    tiny["stages"] = tiny["stages"][:1]
    frame = _run(tmp_path, tiny, trainable)
    assert _values(frame, "packed") == [1.0]


def test_the_check_measures_losses_with_the_comparison_it_is_given(tok, groups):  # noqa: F811
    """``compare`` (how bench/packing_check_null.py swaps in the element-wise comparison) is used for the layout
    noise, the packed difference and what leaked."""
    model = build_builtin(ModelSpec(builtin="qwen2-tiny", config=SMALL["qwen2-tiny"]), tok, seed=0)
    padded = [collate(g, tok.pad_token_id) for g in groups]
    packed = [pack_encoded(g, tok.pad_token_id, *LAYOUTS["varlen"]) for g in groups]
    result = check_packing(model, padded, packed, LossSpec(), TASKS, compare=lambda a, b: 1.0)
    assert result.max_rel_diff == 1.0 and result.noise == 1.0 and result.leaked is None  # 1.0 is within 4x noise
    calls = []
    check_packing(model, padded, packed, LossSpec(), TASKS, compare=lambda a, b: calls.append(a.shape) or 0.0)
    assert len(calls) == 3 * min(len(groups), 3)  # per batch: rows reversed, one example per row, packed


@pytest.mark.parametrize("mode", [True, False])
def test_the_check_sees_the_loss_path_the_stage_trains_with(tok, groups, mode, monkeypatch):  # noqa: F811
    """``train.loss_chunking`` forced on, the check's losses and gradients come from the chunked head (and still
    pass); forced off, from the full logits: the path that trains is the path that is checked."""
    from harness.training import loop
    from harness.training.chunked_loss import Chunking

    calls = []
    chunked = loop.chunked_head_loss
    monkeypatch.setattr(loop, "chunked_head_loss", lambda *a, **k: calls.append(1) or chunked(*a, **k))
    model = build_builtin(ModelSpec(builtin="qwen2-tiny", config=SMALL["qwen2-tiny"]), tok, seed=0)
    padded = [collate(g, tok.pad_token_id) for g in groups]
    packed = [pack_encoded(g, tok.pad_token_id, factor=2) for g in groups]
    result = check_packing(model, padded, packed, LossSpec(), TASKS, chunking=Chunking(mode, 16))
    assert result.exact and (len(calls) > 0) is mode
