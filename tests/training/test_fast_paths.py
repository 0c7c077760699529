"""What makes the training loop fast, asserted structurally (no timings; bench/train_speed.py measures the speed).

- with length grouping on, a stage's plan pads less and every batch follows the mixture (stratified by task);
- the vocabulary projection runs at supervised positions only, never at prompt or padding positions;
- batches are collated once, in the plan, with the supervised positions found there (no dataloader or label-mask
  search on the hot path);
- AdamW is the fused kernel (one call per parameter, not a loop of small ops);
- the per-module-group health metrics run at logging steps only;
- ``train.compile``: compiled training matches eager within float tolerance and is reproducible; ``auto`` compiles
  only long stages with a compiler, falls back to the eager numbers when compiling fails; ``true`` then stops;
- bench/sweep_speed.py's ``--micro`` overrides stay valid and micro.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from harness.config import LossSpec, OptimSpec, TrainSpec, validate_data
from harness.data.batches import Batch, collate
from harness.data.encoding import IGNORE_INDEX, Encoded
from harness.data.stage_batches import plan_stage
from harness.runs.planning.prepare import stage_batching
from harness.training import compiling
from harness.training.loop import StageLoop, batch_loss, make_optimizer, train_stage
from tests.conftest import TINY, drift_bound, relative


def _mixed_pools(n_per_task: int = 400, seed: int = 0) -> dict[str, list[Encoded]]:
    """Three tasks with different length ranges (10-81 tokens overall), answers of a few tokens at the end."""
    rng = np.random.default_rng(seed)
    ranges = {"repeat": (10, 40), "yesno": (15, 30), "math": (30, 82)}
    pools = {}
    for task, (lo, hi) in ranges.items():
        pool = []
        for n in rng.integers(lo, hi, size=n_per_task):
            ids = rng.integers(5, 300, size=n).astype(np.int64)
            labels = np.full(n, IGNORE_INDEX, dtype=np.int64)
            answer = int(rng.integers(2, 8))
            labels[n - answer - 1 : n - 1] = ids[n - answer :]  # pre-shifted: position t predicts token t+1
            pool.append(Encoded(task, ids, labels))
        pools[task] = pool
    return pools


def _experiment(**train):
    data = copy.deepcopy(TINY)
    data["train"].update({"batch_size": 32, **train})
    data["stages"] = [
        {"name": "a", "steps": 64, "mixture": {"repeat": 0.4, "yesno": 0.3, "math": 0.3}},
        {"name": "b", "steps": 37, "mixture": "natural"},
    ]
    return validate_data(data)


def _batches(n_per_task: int, steps: int, size: int = 8) -> tuple[dict[str, list[Encoded]], list[Batch]]:
    """Mixed pools and ``steps`` collated batches of ``size`` examples taken in order (lengths vary per batch)."""
    pools = _mixed_pools(n_per_task)
    examples = [e for pool in pools.values() for e in pool]
    return pools, [collate(examples[i : i + size], pad_id=0) for i in range(0, steps * size, size)]


def _pad_fraction(batches: list[Batch]) -> float:
    return 1 - sum(b.n_real_tokens for b in batches) / sum(b.n_padded_tokens for b in batches)


def _max_share_deviation(batch: Batch, mixture: dict[str, float]) -> float:
    return max(abs(batch.tasks.count(task) / len(batch.tasks) - weight) for task, weight in mixture.items())


def test_grouped_batches_follow_the_mixture_and_pad_less():
    """Grouping (window 50) is stratified by task: every batch holds the mixture's composition — closer to it than
    random batches, which only match it on average — and pads less than random batches."""
    pools, mixture = _mixed_pools(), {"repeat": 0.4, "yesno": 0.3, "math": 0.3}
    grouped, ungrouped = _experiment(length_grouping=50), _experiment()  # the default is off
    for index, stage in enumerate(grouped.resolved_stages()):
        plan = plan_stage(stage_batching(grouped), stage, index, pools, pad_id=0)
        assert len(plan.batches) == stage.steps
        assert all(len(b.tasks) == 32 for b in plan.batches), "batch_size examples per optimiser step"
    stage = grouped.resolved_stages()[0]
    with_grouping = plan_stage(stage_batching(grouped), stage, 0, pools, pad_id=0).batches
    without = plan_stage(stage_batching(ungrouped), ungrouped.resolved_stages()[0], 0, pools, pad_id=0).batches
    deviation = [np.mean([_max_share_deviation(b, mixture) for b in plan]) for plan in (with_grouping, without)]
    assert deviation[0] < 0.04 < deviation[1], deviation  # measured: 0.021 grouped, 0.092 random
    assert _pad_fraction(with_grouping) < 0.8 * _pad_fraction(without)  # measured: 0.40 vs 0.57


def test_grouped_batches_hold_similar_lengths_within_each_task():
    """Within a task, a grouped batch is a slice of that task's length order: its length range is a small part of
    the task's range in the window (what keeps padding low, and what bench/plain_vs_harness.py measures)."""
    pools, exp = _mixed_pools(), _experiment(length_grouping=50)
    plan = plan_stage(stage_batching(exp), exp.resolved_stages()[0], 0, pools, pad_id=0)
    examples = [e for pool in pools.values() for e in pool]
    for task in ("repeat", "math"):
        task_range = np.ptp([e.length for e in examples if e.task == task])
        spans = []
        for b in plan.batches:
            rows = [i for i, t in enumerate(b.tasks) if t == task]
            lengths = b.attention_mask[rows].sum(dim=1)
            spans.append(int(lengths.max() - lengths.min()))
        assert np.mean(spans) < 0.25 * task_range, (task, np.mean(spans), task_range)


def test_plan_batches_are_collated_once_with_their_supervised_positions():
    exp, pools = _experiment(), _mixed_pools()
    plan = plan_stage(stage_batching(exp), exp.resolved_stages()[0], 0, pools, pad_id=0)
    for b in plan.batches[:8]:
        assert isinstance(b, Batch) and isinstance(b.input_ids, torch.Tensor)  # tensors, not examples
        flat = b.labels.flatten()
        assert torch.equal(b.supervised, (flat != IGNORE_INDEX).nonzero().flatten())
        assert (flat[b.supervised] != IGNORE_INDEX).all()
        assert b.n_real_tokens == int(b.attention_mask.sum()) and b.n_padded_tokens == b.input_ids.numel()


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=320,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def test_vocabulary_projection_only_at_supervised_positions(tiny_model):
    model = copy.deepcopy(tiny_model)
    pools = _mixed_pools(8)
    batch = collate(pools["repeat"][:4] + pools["math"][:4], pad_id=0)
    rows = []
    handle = model.get_output_embeddings().register_forward_hook(
        lambda module, inputs, output: rows.append(inputs[0].reshape(-1, inputs[0].shape[-1]).shape[0])
    )
    try:
        loss, ce, task_of_token = batch_loss(model, batch, LossSpec(), torch.zeros(8, dtype=torch.long), ["t"])
        loss.backward()
    finally:
        handle.remove()
    n_supervised = int((batch.labels != IGNORE_INDEX).sum())
    assert rows == [n_supervised], "one projection, of exactly the supervised positions"
    assert n_supervised < batch.n_real_tokens < batch.n_padded_tokens

    # … and it is the same loss as the full projection's at those positions, to rounding: within DRIFT_FACTOR × how
    # far the full projection moves with the batch's rows reversed (tests/conftest.py).
    def full_projection_loss(flip: bool) -> float:
        ids, mask, labels = (t.flip(0) if flip else t for t in (batch.input_ids, batch.attention_mask, batch.labels))
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits
        selected = labels != IGNORE_INDEX
        return torch.nn.functional.cross_entropy(logits[selected], labels[selected]).item()

    full, reordered = full_projection_loss(False), full_projection_loss(True)
    assert relative([full], [loss.item()]) <= drift_bound(relative([full], [reordered]))
    assert ce.shape == task_of_token.shape == (n_supervised,)


def test_example_reduction_weighs_every_batch_row_the_same(tiny_model):
    """``loss: {reduction: example}`` through the training loss: the mean over rows of each row's mean token CE."""
    pools = _mixed_pools(8)
    batch = collate(pools["repeat"][:4] + pools["math"][:4], pad_id=0)
    loss, ce, _ = batch_loss(tiny_model, batch, LossSpec(reduction="example"), torch.zeros(8, dtype=torch.long), ["t"])
    rows = batch.supervised // batch.labels.shape[1]
    per_row = [ce[rows == r].mean() for r in range(batch.labels.shape[0])]
    assert len({int((rows == r).sum()) for r in range(8)}) > 1, "rows of different answer lengths"
    assert torch.allclose(loss.detach(), torch.stack(per_row).mean(), atol=1e-6)
    assert not torch.allclose(loss.detach(), ce.mean(), atol=1e-4)  # differs from the token mean here


def test_adamw_is_the_fused_kernel(tiny_model):
    optimizer, _ = make_optimizer(tiny_model, OptimSpec(), total_steps=10)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.defaults["fused"] is True and not optimizer.defaults.get("foreach")


def test_health_metrics_run_at_logging_steps_only(tiny_model, monkeypatch):
    from harness.training.health import GroupStats

    model = copy.deepcopy(tiny_model)
    calls = {"grad_norms": 0, "snapshot": 0}
    for name in calls:
        original = getattr(GroupStats, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(GroupStats, name, counted)
    pools, batches = _batches(40, steps=12)
    logged = []
    train_stage(
        model,
        batches,
        StageLoop(
            stage="s",
            start_step=0,
            optim=OptimSpec(lr=1e-3),
            tasks=list(pools),
            log=lambda rows, step: logged.append(step),
            evaluate=lambda step: None,
            log_every=5,
        ),
    )
    assert logged == [5, 10, 12]
    assert calls == {"grad_norms": 3, "snapshot": 3}, "health metrics only when a window is logged"


def _train_copy(model, batches, tasks, **loop):
    model = copy.deepcopy(model)
    logged = []
    train_stage(
        model,
        batches,
        StageLoop(
            stage="s",
            start_step=0,
            optim=OptimSpec(lr=1e-3),
            tasks=tasks,
            log=lambda rows, step: logged.extend(rows),
            evaluate=lambda step: None,
            log_every=2,
            **loop,
        ),
    )
    return model, logged


def _param_differences(a: torch.nn.Module, b: torch.nn.Module) -> np.ndarray:
    """Per parameter, the largest difference between two models relative to the first's largest magnitude."""
    with torch.no_grad():
        return np.array([float((x - y).abs().max() / x.abs().max()) for x, y in zip(a.parameters(), b.parameters())])


def _losses(rows) -> dict:
    return {(r.step, r.task): r.value for r in rows if r.metric == "loss"}


@pytest.mark.slow  # inductor's cold compile dominates (~35 s on 2 cores); compile's refusals stay in the default suite
def test_compiled_training_matches_eager_and_keeps_plain_state_dicts(tiny_model):
    """``train.compile``: the same updates as eager to rounding (fused kernels reorder float sums: within
    DRIFT_FACTOR × what eager with every batch's rows reversed gives, tests/conftest.py), the compiled forward
    really used, and no compile wrapper in the model's state dict (checkpoints unchanged)."""
    pools, batches = _batches(16, steps=4)
    examples = [e for pool in pools.values() for e in pool]
    rows_reversed = [collate(examples[i : i + 8][::-1], pad_id=0) for i in range(0, 4 * 8, 8)]
    eager, eager_rows = _train_copy(tiny_model, batches, list(pools))
    reordered, reordered_rows = _train_copy(tiny_model, rows_reversed, list(pools))
    compiled, compiled_rows = _train_copy(tiny_model, batches, list(pools), compile=True)
    wrapper = compiling._COMPILED.get(compiled.base_model)
    assert wrapper is not None and wrapper.called and wrapper.error is None, "compiled forward not used"
    assert not torch.are_deterministic_algorithms_enabled(), "deterministic algorithms only while compiled"
    again, _ = _train_copy(tiny_model, batches, list(pools), compile=True)
    assert all(torch.equal(a, b) for a, b in zip(compiled.parameters(), again.parameters())), "reproducible"
    assert list(compiled.state_dict()) == list(eager.state_dict())
    got, reference = _param_differences(eager, compiled), _param_differences(eager, reordered)
    assert got.max() <= drift_bound(reference), (got.max(), reference.max())
    eager_losses, compiled_losses, reordered_losses = (_losses(r) for r in (eager_rows, compiled_rows, reordered_rows))
    assert len(eager_losses) >= 4 and compiled_losses.keys() == eager_losses.keys() == reordered_losses.keys()
    keys = sorted(eager_losses, key=str)
    loss_rel = relative([eager_losses[k] for k in keys], [compiled_losses[k] for k in keys])
    assert loss_rel.max() <= drift_bound(relative([eager_losses[k] for k in keys], [reordered_losses[k] for k in keys]))


def _failing_compile(at: str):
    """A ``torch.compile`` that fails as a missing C++ compiler does: at the wrap, or at the first call."""

    def broken_compile(module, **kwargs):
        def call(*args, **kw):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

        if at == "wrap":
            call()
        return call

    return broken_compile


@pytest.mark.parametrize("at", ["wrap", "first call"])
def test_a_failed_compile_under_auto_falls_back_to_the_eager_numbers(
    tiny_model, monkeypatch, caplog, auto_compiles, at
):
    monkeypatch.setattr(torch, "compile", _failing_compile(at))
    pools, batches = _batches(8, steps=3)
    eager, eager_rows = _train_copy(tiny_model, batches, list(pools), compile=False)
    before = compiling.fallbacks
    with caplog.at_level("WARNING", logger="harness.training.compiling"):
        fallback, fallback_rows = _train_copy(tiny_model, batches, list(pools), compile="auto")
    assert "torch.compile failed (RuntimeError: InvalidCxxCompiler" in caplog.text
    assert caplog.text.count("torch.compile failed") == 1, "warned once, then eager without retrying"
    assert compiling.fallbacks == before + 1, "counted (the stage cache stops writing)"
    assert not torch.are_deterministic_algorithms_enabled()
    for a, b in zip(eager.parameters(), fallback.parameters()):
        assert torch.equal(a, b)
    losses = [[(r.step, r.task, r.value) for r in rows if r.metric == "loss"] for rows in (eager_rows, fallback_rows)]
    assert losses[0] and losses[0] == losses[1]


def test_a_failed_first_call_leaves_the_random_state_as_it_was(monkeypatch):
    def compile_that_draws(module, **kwargs):
        def call(*args, **kw):
            torch.rand(3)  # Dynamo ran one graph (drawing random numbers), then the next one failed to compile
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

        return call

    monkeypatch.setattr(torch, "compile", compile_that_draws)
    module, x = torch.nn.Linear(2, 2), torch.ones(1, 2)
    torch.manual_seed(0)
    expected = (module(x), torch.rand(1))
    torch.manual_seed(0)
    out = compiling.forward_of(module, "auto")(x)
    assert torch.equal(out, expected[0]) and torch.equal(torch.rand(1), expected[1])


def test_a_failed_compile_under_true_is_a_clear_error(tiny_model, monkeypatch):
    monkeypatch.setattr(torch, "compile", _failing_compile("first call"))
    pools, batches = _batches(8, steps=2)
    with pytest.raises(
        compiling.CompileFailed,
        match=r"train.compile: true, but torch.compile failed "
        r"\(RuntimeError: InvalidCxxCompiler.*set train.compile to auto",
    ):
        _train_copy(tiny_model, batches, list(pools), compile=True)


def test_auto_compiles_only_long_stages_with_a_compiler(tiny_model, monkeypatch):
    assert TrainSpec().compile == "auto", "the default"
    calls = []
    monkeypatch.setattr(torch, "compile", lambda module, **kw: calls.append(module) or module)
    pools, batches = _batches(8, steps=3)
    _train_copy(tiny_model, batches, list(pools), compile="auto")
    assert calls == [], "a short stage stays eager"
    long_enough = compiling.AUTO_COMPILE_MIN_STEPS
    assert compiling.compile_decision("auto", long_enough, "cpu") == compiling.can_compile("cpu")
    assert not compiling.compile_decision("auto", long_enough - 1, "cpu")
    assert not compiling.compile_decision("auto", 10 * long_enough, "cuda"), "GPU stages: not measured, eager"
    monkeypatch.setattr(compiling, "can_compile", lambda device_type: True)
    assert compiling.compile_decision(True, 1, "cpu") and not compiling.compile_decision(False, 10**6, "cpu")
    monkeypatch.setattr(compiling, "can_compile", lambda device_type: False)
    assert not compiling.compile_decision("auto", 10 * long_enough, "cpu"), "no compiler: eager"
    with pytest.raises(compiling.CompileFailed, match="cannot run on cpu here"):
        compiling.compile_decision(True, 5, "cpu")  # before any training
    monkeypatch.setattr(compiling, "AUTO_COMPILE_MIN_STEPS", 3)
    monkeypatch.setattr(compiling, "can_compile", lambda device_type: True)
    _train_copy(tiny_model, batches, list(pools), compile="auto")
    assert len(calls) == 1, "a stage of AUTO_COMPILE_MIN_STEPS steps compiles"


def test_sweep_speed_micro_overrides_stay_a_valid_micro_sweep():
    """``bench/sweep_speed.py --micro`` (not run here: ~5 min) passes its overrides to ``harness sweep``: they must
    keep validating against the quickstart and the sweep, and keep it micro."""
    import importlib.util

    from harness.studies.sweep import load_sweep
    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location("sweep_speed", ROOT / "bench" / "sweep_speed.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    sweep = load_sweep(ROOT / "experiments" / "sweeps" / "yesno_vs_qa.yaml", bench.MICRO)
    assert [s.steps for s in sweep.base.resolved_stages()] == [4, 4, 4]
    assert sweep.base.model.pretrain.steps == 4 and sweep.base.eval.splits == ["heldout_template"]
    assert all(t.train <= 40 and t.eval <= 4 for t in sweep.base.tasks.values())
