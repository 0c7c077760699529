"""Losses: GEM against a direct implementation of its formula (values and gradients), CE, the per-token weights."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from harness.config import LossSpec, validate_data
from harness.training.losses import (
    first_answer_tokens,
    gem_token_losses,
    token_losses_and_ce,
    token_losses_from_logits,
    weighted_mean,
)


def reference_gem(logits: torch.Tensor, targets: torch.Tensor, beta: float, h: str) -> list[float]:
    """GEM per token written from the formula, one scalar at a time with ``math`` (no torch ops shared with the
    implementation): loss = −Σ_v q_v w_v (log p_y − log p_v), q = softmax(z/β), w_v = 1 (linear) or
    σ(0.01 (z_v − z_y)) (logsigmoid); log p_y − log p_v = z_y − z_v because the log-partition cancels."""
    out = []
    for row, y in zip(logits.tolist(), targets.tolist()):
        m = max(row)
        exps = [math.exp((z - m) / beta) for z in row]
        total = sum(exps)
        loss = 0.0
        for z_v, e in zip(row, exps):
            q_v = e / total
            w_v = 1.0 if h == "linear" else 1.0 / (1.0 + math.exp(-0.01 * (z_v - row[y])))
            loss -= q_v * w_v * (row[y] - z_v)
        out.append(loss)
    return out


def reference_gem_grad(logits: torch.Tensor, targets: torch.Tensor, beta: float, h: str) -> torch.Tensor:
    """d loss / d z = c − (Σ c) onehot(y), c = q ⊙ w (q and w carry no gradient in GEM)."""
    grads = []
    for row, y in zip(logits.tolist(), targets.tolist()):
        m = max(row)
        exps = [math.exp((z - m) / beta) for z in row]
        total = sum(exps)
        c = [
            e / total * (1.0 if h == "linear" else 1.0 / (1.0 + math.exp(-0.01 * (z - row[y]))))
            for z, e in zip(row, exps)
        ]
        g = list(c)
        g[y] -= sum(c)
        grads.append(g)
    return torch.tensor(grads, dtype=torch.float64)


@pytest.mark.parametrize("h", ["linear", "logsigmoid"])
@pytest.mark.parametrize("beta", [0.05, 0.3, 0.7, 1.0])
def test_gem_matches_the_formula(beta, h):
    gen = torch.Generator().manual_seed(int(beta * 100) + len(h))
    logits = (torch.randn(9, 13, generator=gen, dtype=torch.float64) * 3).requires_grad_(True)
    targets = torch.randint(0, 13, (9,), generator=gen)
    losses = gem_token_losses(logits, targets, beta, h)
    assert losses.dtype == torch.float64
    assert torch.allclose(
        losses.detach(),
        torch.tensor(reference_gem(logits.detach(), targets, beta, h), dtype=torch.float64),
        atol=1e-10,
        rtol=1e-10,
    )
    losses.sum().backward()
    assert torch.allclose(logits.grad, reference_gem_grad(logits.detach(), targets, beta, h), atol=1e-10)


def test_gem_gradcheck_of_its_differentiable_part():
    """GEM is a surrogate with stop-gradients (q and the weights), so a finite-difference check of the whole
    function does not apply; with q and w frozen at the evaluation point it is an ordinary function, and
    autograd's gradient matches finite differences there."""
    gen = torch.Generator().manual_seed(0)
    z0 = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 6, (4,), generator=gen)
    q = torch.softmax(z0 / 0.7, -1)
    w = torch.sigmoid(0.01 * (z0 - z0.gather(-1, y[:, None])))

    def frozen(z):
        logp = F.log_softmax(z, -1)
        return -(q * w * (logp.gather(-1, y[:, None]) - logp)).sum(-1)

    z = z0.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(frozen, (z,))
    g_impl = torch.autograd.grad(gem_token_losses(z, y, 0.7, "logsigmoid").sum(), z)[0]
    g_frozen = torch.autograd.grad(frozen(z).sum(), z)[0]
    assert torch.allclose(g_impl, g_frozen, atol=1e-12)


def test_gem_beta_one_linear_has_the_ce_gradient():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 10, generator=gen, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 10, (6,), generator=gen)
    g_gem = torch.autograd.grad(gem_token_losses(logits, targets, 1.0, "linear").sum(), logits)[0]
    g_ce = torch.autograd.grad(F.cross_entropy(logits, targets, reduction="sum"), logits)[0]
    assert torch.allclose(g_gem, g_ce, atol=1e-12)


def test_gem_small_beta_stops_pushing_a_token_that_already_wins():
    """β → 0: q → onehot(argmax). Where the label is already the argmax GEM's gradient vanishes (CE's does not);
    where another token wins, the gradient is ≈ onehot(winner) − onehot(label)."""
    logits = torch.tensor([[4.0, 1.0, 0.0, -1.0], [1.0, 4.0, 0.0, -1.0]], dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 0])
    g = torch.autograd.grad(gem_token_losses(logits, targets, 0.05, "linear").sum(), logits)[0]
    assert g[0].abs().max() < 1e-20
    assert torch.allclose(g[1], torch.tensor([-1.0, 1.0, 0.0, 0.0], dtype=torch.float64), atol=1e-20)
    g_ce = torch.autograd.grad(F.cross_entropy(logits, targets, reduction="sum"), logits)[0]
    assert g_ce[0].abs().max() > 1e-3
    # A tiny difference between β values gives a tiny difference in the loss (smooth in β).
    a = gem_token_losses(logits.detach(), targets, 0.7, "linear")
    b = gem_token_losses(logits.detach(), targets, 0.7 + 1e-6, "linear")
    assert (a - b).abs().max() < 1e-4


def test_loss_dispatch_dtypes_and_logged_ce():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(5, 8, generator=gen).to(torch.bfloat16).requires_grad_(True)
    targets = torch.randint(0, 8, (5,), generator=gen)
    ce = token_losses_from_logits(logits, targets, LossSpec())
    assert ce.dtype == torch.float32
    assert torch.allclose(ce, F.cross_entropy(logits.float(), targets, reduction="none"))
    gem, logged = token_losses_and_ce(logits, targets, LossSpec.model_validate("gem"))
    assert gem.dtype == torch.float32 and gem.requires_grad and not logged.requires_grad
    assert torch.allclose(logged, ce.detach())
    assert torch.allclose(gem, gem_token_losses(logits.float(), targets, 0.7, "linear"))
    with pytest.raises(ValueError, match="h"):
        gem_token_losses(logits, targets, 0.7, "tanh")


def test_first_answer_tokens():
    IGN = -100
    labels = torch.tensor([[IGN, IGN, 5, 6, 7, IGN, IGN, 8, 9, IGN], [3, 4, IGN, IGN, IGN, IGN, IGN, IGN, IGN, IGN]])
    first = first_answer_tokens(labels)
    assert first.tolist() == [
        [False, False, True, False, False, False, False, True, False, False],
        [True, False, False, False, False, False, False, False, False, False],
    ]


def test_weighted_mean():
    losses = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    tasks = torch.tensor([0, 0, 1, 1])
    first = torch.tensor([True, False, True, False])
    assert weighted_mean(losses, tasks, first, LossSpec()).item() == pytest.approx(2.5)
    spec = LossSpec(task_weights={"b": 3.0})
    # weights 1, 1, 3, 3 → (1 + 2 + 9 + 12) / 8
    assert weighted_mean(losses, tasks, first, spec, tasks=["a", "b"]).item() == pytest.approx(24 / 8)
    assert weighted_mean(losses, tasks, first, LossSpec(task_weights={"1": 3.0})).item() == pytest.approx(24 / 8)
    spec = LossSpec(first_token_weight=4.0)
    # weights 4, 1, 4, 1 → (4 + 2 + 12 + 4) / 10
    assert weighted_mean(losses, tasks, first, spec).item() == pytest.approx(22 / 10)
    spec = LossSpec(task_weights={"a": 0.0}, first_token_weight=2.0)
    # weights 0, 0, 2, 1 → (6 + 4) / 3
    value = weighted_mean(losses, tasks, first, spec, tasks=["a", "b"])
    assert value.item() == pytest.approx(10 / 3)
    value.backward()
    assert losses.grad.tolist() == pytest.approx([0, 0, 2 / 3, 1 / 3])
    zero = weighted_mean(losses, tasks, first, LossSpec(task_weights={"a": 0.0, "b": 0.0}), tasks=["a", "b"])
    assert zero.item() == 0.0
    with pytest.raises(ValueError, match="unknown task 'c'"):
        weighted_mean(losses, tasks, first, LossSpec(task_weights={"c": 2.0}), tasks=["a", "b"])


def test_weighted_mean_per_example():
    """``reduction: example``: the mean of per-example means, so a 2-token answer weighs as much as a 3-token one."""
    losses = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], requires_grad=True)
    tasks = torch.tensor([0, 0, 0, 1, 1])
    examples = torch.tensor([0, 0, 0, 2, 2])  # batch row 1 has no supervised token
    spec = LossSpec(reduction="example")
    value = weighted_mean(losses, tasks, None, spec, example_of_token=examples, n_examples=3)
    assert value.item() == pytest.approx((2.0 + 4.5) / 2)  # the token mean is 3.0
    value.backward()
    assert losses.grad.tolist() == pytest.approx([1 / 6, 1 / 6, 1 / 6, 1 / 4, 1 / 4])
    # with a task weight: example 2 (task b) counts 3 times example 0 → (2.0 + 3 · 4.5) / 4
    spec = LossSpec(reduction="example", task_weights={"b": 3.0})
    assert weighted_mean(
        losses, tasks, None, spec, tasks=["a", "b"], example_of_token=examples, n_examples=3
    ).item() == pytest.approx(15.5 / 4)
    # the first-token weight moves weight within an example, not onto it: shares 3/5, 1/5, 1/5 and 3/4, 1/4
    first = torch.tensor([True, False, False, True, False])
    spec = LossSpec(reduction="example", first_token_weight=3.0)
    assert weighted_mean(losses, tasks, first, spec, example_of_token=examples, n_examples=3).item() == pytest.approx(
        (8 / 5 + 17 / 4) / 2
    )
    with pytest.raises(ValueError, match="example"):
        weighted_mean(losses, tasks, None, LossSpec(reduction="example"))


def test_a_stage_can_set_the_reduction_back_to_token():
    """``reduction`` is left out of dumps unless set (finished runs from before it still match); a stage that sets
    it to the default over an experiment's ``example`` still gets ``token``."""
    base = {
        "name": "x",
        "tasks": {"t": {"recipe": "repeat", "train": 4, "eval": 2}},
        "train": {"loss": {"reduction": "example"}},
        "stages": [
            {"name": "a", "steps": 1, "mixture": {"t": 1.0}},
            {"name": "b", "steps": 1, "mixture": {"t": 1.0}, "loss": {"reduction": "token"}},
        ],
    }
    exp = validate_data(base, "test")
    assert [s.train.loss.reduction for s in exp.resolved_stages()] == ["example", "token"]
    assert "reduction" not in LossSpec().model_dump()
