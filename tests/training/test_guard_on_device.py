"""The non-finite guard decided on the training device (harness.training.guard.StepGuard, the loop's verdicts).

- nothing reads the device between a step's gradient norm and its optimiser step: the update is applied or
  skipped by the fused AdamW's ``found_inf``, and the host reads the verdict later;
- a finite run trains and logs bit for bit as with the guard off — the code path the guard had before for finite
  steps (clip by the total norm, a plain fused AdamW step), so the store rows equal the old ones;
- a flagged step changes nothing that the update owns (weights, moments, step counts), is counted as skipped, and
  its report is exact (the first bad module, the bad gradients), read as late as the next step;
- an injected forward fault over consecutive steps is re-run for each step's report without leaking its hook.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from harness.config import NonFiniteSpec, OptimSpec
from harness.data.batches import collate
from harness.data.encoding import IGNORE_INDEX, Encoded
from harness.training.guard import Injector, NonFiniteError
from harness.training.loop import StageLoop, train_stage

TASKS = ["a", "b"]


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


def _batches(steps: int, size: int = 6, seed: int = 0):
    """``steps`` padded batches of two tasks' examples (10-40 tokens, answers of a few tokens at the end)."""
    rng = np.random.default_rng(seed)
    examples = []
    for k in range(steps * size):
        n = int(rng.integers(10, 40))
        ids = rng.integers(5, 300, size=n).astype(np.int64)
        labels = np.full(n, IGNORE_INDEX, dtype=np.int64)
        answer = int(rng.integers(2, 6))
        labels[n - answer - 1 : n - 1] = ids[n - answer :]  # pre-shifted: position t predicts token t+1
        examples.append(Encoded(TASKS[k % 2], ids, labels))
    return [collate(examples[i : i + size], pad_id=0) for i in range(0, len(examples), size)]


def _train(model, batches, weights_after=None, **settings):
    """Train ``model`` on ``batches`` (log every 4 steps, health metrics on); the logged rows. ``weights_after``
    collects a copy of the weights after every step."""
    rows = []

    def progress(n):
        if weights_after is not None:
            weights_after.append({k: v.detach().clone() for k, v in model.state_dict().items()})

    loop = StageLoop(
        "s",
        0,
        TASKS,
        lambda new, step: rows.extend(new),
        lambda step: None,
        progress=progress,
        optim=OptimSpec(lr=1e-2, warmup=2, grad_clip=0.5),
        log_every=4,
        **settings,
    )
    train_stage(model, batches, loop)
    return rows


def _values(rows):
    # tokens_per_s is wall time: the one row that may differ between two identical runs
    return [(r.step, r.task, r.metric, r.value) for r in rows if r.metric != "tokens_per_s"]


def test_no_host_read_between_a_steps_gradient_norm_and_its_update(tiny_model, monkeypatch):
    """Every step's update is issued without the host waiting for that step's numbers: no ``item``/``tolist``
    between ``get_total_norm`` and ``AdamW.step`` (the guard used to read its flags there, one sync per step)."""
    events: list[str] = []
    for cls, name in ((torch.Tensor, "item"), (torch.Tensor, "tolist")):
        original = getattr(cls, name)

        def recorded(self, *args, _original=original, **kwargs):
            events.append("read")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, recorded)
    total_norm, adamw_step = torch.nn.utils.get_total_norm, torch.optim.AdamW.step

    def norm(*args, **kwargs):
        events.append("norm")
        return total_norm(*args, **kwargs)

    def step(self, *args, **kwargs):
        events.append("step")
        return adamw_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "get_total_norm", norm)
    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    _train(copy.deepcopy(tiny_model), _batches(9), nonfinite=NonFiniteSpec(action="stop"))
    assert events.count("norm") == events.count("step") == 9
    between = [events[i + 1 : events.index("step", i)] for i, e in enumerate(events) if e == "norm"]
    assert all("read" not in seen for seen in between), between
    assert "read" in events, "the verdicts are read, later"


def test_a_finite_run_is_bit_identical_with_the_guard_off(tiny_model):
    """With the guard off a step is what every finite step was before the guard moved to the device (clip by the
    total norm, a plain fused AdamW step): the guarded run's store rows and final weights equal it exactly."""
    batches = _batches(10)
    runs = {}
    for action in ("stop", "skip_step", "off"):
        model = copy.deepcopy(tiny_model)
        rows = _train(model, batches, nonfinite=NonFiniteSpec(action=action))
        runs[action] = (_values(rows), model.state_dict())
    reference_rows, reference_weights = runs["off"]
    assert any(metric.startswith("diag/") for _, _, metric, _ in reference_rows)
    for action in ("stop", "skip_step"):
        rows, weights = runs[action]
        assert rows == reference_rows, action
        assert all(torch.equal(weights[k], reference_weights[k]) for k in reference_weights), action


def test_a_flagged_step_leaves_the_update_state_untouched_and_is_counted(tiny_model):
    """A NaN gradient at step 3 under ``skip_step``: the weights after step 3 are those after step 2 (the fused
    kernel skipped the update on the device), training goes on, and the skip is logged at its own step."""
    after: list[dict] = []
    model = copy.deepcopy(tiny_model)
    rows = _train(
        model,
        _batches(6),
        weights_after=after,
        nonfinite=NonFiniteSpec(action="skip_step"),
        injector=Injector(step=3, where="grad", module=r"layers\.1\.mlp\.up_proj"),
    )
    same = [all(torch.equal(after[s][k], after[s - 1][k]) for k in after[s]) for s in range(1, 6)]
    assert same == [False, True, False, False, False], "only step 3 (index 2) left the weights as they were"
    assert [r.step for r in rows if r.metric == "nonfinite_skip"] == [3]
    assert sum(r.value for r in rows if r.metric == "skipped_steps") == 1
    assert all(np.isfinite(r.value) for r in rows if r.metric in ("loss", "grad_norm"))
    assert all(torch.isfinite(v).all() for v in model.state_dict().values()), "moments never saw the NaN"


@pytest.mark.parametrize(
    "where, module, what, first, grads",
    [
        ("grad", r"layers\.1\.mlp\.up_proj", "gradient", None, ["model.layers.1.mlp.up_proj.weight"]),
        ("forward", r"layers\.0\.mlp$", "loss", "model.layers.0.mlp", None),
    ],
)
def test_the_report_of_a_step_read_late_is_exact(tiny_model, where, module, what, first, grads):
    """Step 3 is not a log step: its verdict is read during step 4, and the report still names step 3, the first
    module with a non-finite output (its forward re-run with the step's fault) and the bad gradients."""
    model = copy.deepcopy(tiny_model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    after: list[dict] = []
    with pytest.raises(NonFiniteError) as info:
        _train(model, _batches(6), weights_after=after, injector=Injector(step=3, where=where, module=module))
    report = info.value.report
    assert (report["step"], report["what"], report["first_module"]) == (3, what, first)
    assert sum(report["tasks"].values()) == 6
    if grads is not None:
        assert report["nonfinite_grads"] == grads
    else:  # a NaN output of layer 0 reaches the gradients of every parameter used after it
        assert "model.layers.0.mlp.down_proj.weight" in report["nonfinite_grads"]
        assert "model.embed_tokens.weight" in report["nonfinite_grads"]
    assert len(after) == 3 and all(torch.isfinite(v).all() for v in model.state_dict().values())
    assert all(torch.equal(after[2][k], after[1][k]) for k in after[1]), "step 3's update was never applied"
    assert not all(torch.equal(after[1][k], before[k]) for k in before)


def test_consecutive_forward_faults_each_get_their_report_and_the_hook_goes(tiny_model):
    """A forward fault at steps 3 and 4 under ``skip_step``: each step is flagged (the report of step 3 re-runs its
    forward while step 4's fault is already hooked in), and step 5 trains again with no fault left behind."""
    after: list[dict] = []
    rows = _train(
        copy.deepcopy(tiny_model),
        _batches(7),
        weights_after=after,
        nonfinite=NonFiniteSpec(action="skip_step"),
        injector=Injector(step=3, where="forward", module=r"layers\.0\.mlp$", repeat=2),
    )
    assert [r.step for r in rows if r.metric == "nonfinite_skip"] == [3, 4]
    changed = [not all(torch.equal(after[s][k], after[s - 1][k]) for k in after[s]) for s in range(1, 7)]
    assert changed == [True, False, False, True, True, True]


def test_health_metrics_read_in_one_go_equal_the_per_parameter_reads(tiny_model):
    """The group grad norms and update ratios read from the device once per log step equal, bit for bit, the same
    sums read one parameter at a time (the code path before), summed on the host in the same order."""
    from harness.training.health import GroupStats

    model = copy.deepcopy(tiny_model)
    batch = _batches(1)[0]
    stats = GroupStats(model)
    loss = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.input_ids).loss
    loss.backward()
    before = stats.snapshot()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    expected_norms, expected_ratios, delta_total, norm_total = {}, {}, 0.0, 0.0
    for group, params in stats.groups.items():
        expected_norms[group] = float(torch.stack([p.grad.float().norm() for _, p in params]).norm())
        delta = sum(float(((p.detach() - b) ** 2).sum()) for (_, p), b in zip(params, before[group]))
        norm = sum(float((p.detach() ** 2).sum()) for _, p in params)
        expected_ratios[group] = (delta / norm) ** 0.5
        delta_total, norm_total = delta_total + delta, norm_total + norm
    expected_ratios["all"] = (delta_total / norm_total) ** 0.5
    assert stats.grad_norms() == expected_norms
    assert stats.update_ratios(before) == expected_ratios


@pytest.mark.parametrize("action", ["stop", "off"])
def test_a_steps_gradients_are_freed_before_the_next_backward(tiny_model, action):
    """The guard keeps a step's gradients until its verdict is read (for the report of a flagged step), never longer:
    by the next step's backward they are gone, as with no guard — a full extra set of gradients at the peak of every
    step would cost a large model its memory."""
    import weakref

    model = copy.deepcopy(tiny_model)
    param = model.get_input_embeddings().weight
    previous: list = []
    alive_at_backward: list[bool] = []

    def after_accumulate(p):
        alive_at_backward.append(bool(previous) and previous[-1]() is not None)
        previous.append(weakref.ref(p.grad))

    handle = param.register_post_accumulate_grad_hook(after_accumulate)
    try:
        _train(model, _batches(6), nonfinite=NonFiniteSpec(action=action))
    finally:
        handle.remove()
    assert len(alive_at_backward) == 6 and not any(alive_at_backward), alive_at_backward
