"""Training health by module group: gradient norm and update ratio ‖Δθ‖/‖θ‖ for the embeddings, each block's
attention and MLP, the norms and the head, so a layer going wrong shows before the loss does. Measured at log steps
only (:mod:`harness.training.loop`), each measure read from the device in one go.

Groups come from parameter names (``model.layers.3.self_attn.q_proj.weight`` → ``layers.3.attn``), which
covers the Llama/Qwen/GPT-2 naming families; anything else falls in ``other``.
"""

from __future__ import annotations

import re
from collections import defaultdict

import torch

_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")
_ATTN = re.compile(r"attn|attention|linear_attn")
_MLP = re.compile(r"mlp|feed_forward|ffn")


def gathered(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a plain tensor: a DTensor (FSDP's sharded parameters and gradients, and reductions of them, which
    hold this rank's part) becomes its global value — a collective every rank must call in the same order."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def module_group(name: str) -> str:
    """The health group of a parameter name."""
    layer = _LAYER.search(name)
    if layer:
        rest = name[layer.end() :]
        if _ATTN.search(rest):
            return f"layers.{layer.group(1)}.attn"
        if _MLP.search(rest):
            return f"layers.{layer.group(1)}.mlp"
        if "norm" in rest or rest.startswith("ln_"):
            return "norms"
        return f"layers.{layer.group(1)}.other"
    if "lm_head" in name or name.endswith("head.weight"):
        return "head"
    if "embed" in name or re.search(r"(?:^|\.)(wte|wpe)\.", name):
        return "embed"
    if "norm" in name or re.search(r"(?:^|\.)ln_f\.", name):
        return "norms"
    return "other"


class Unmeasured:
    """The group statistics of a stage without ``train.diagnostics``: nothing is measured."""

    def grad_norms(self) -> None:
        return None

    def snapshot(self) -> None:
        return None


class GroupStats:
    """Per-group gradient norms (read before clipping) and update ratios of one optimiser step."""

    def __init__(self, model):
        groups: dict[str, list[tuple[str, torch.nn.Parameter]]] = defaultdict(list)
        seen = set()
        for name, p in model.named_parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                groups[module_group(name)].append((name, p))
        self.groups = dict(groups)

    def grad_norms(self) -> dict[str, float]:
        norms = {}
        for group, params in self.groups.items():
            grads = [gathered(p.grad.detach().float().norm()) for _, p in params if p.grad is not None]
            if grads:
                norms[group] = torch.stack(grads).norm()
        # one read of the device for every group (a log step's cost is one sync, not one per group)
        return dict(zip(norms, torch.stack(list(norms.values())).tolist())) if norms else {}

    def snapshot(self) -> dict[str, list[torch.Tensor]]:
        return {g: [p.detach().clone() for _, p in ps] for g, ps in self.groups.items()}

    def update_ratios(self, before: dict[str, list[torch.Tensor]]) -> dict[str, float]:
        """‖Δθ‖/‖θ‖ per group, and ``all`` over every trainable parameter."""
        # Every parameter's two sums in one read of the device, then added up on the host in parameter order (the
        # same float64 sums as adding each one as it is read).
        sums = []
        for group, params in self.groups.items():
            sums += [gathered(((p.detach() - b) ** 2).sum()).float() for (_, p), b in zip(params, before[group])]
            sums += [gathered((p.detach() ** 2).sum()).float() for _, p in params]
        values = iter(torch.stack(sums).tolist() if sums else [])
        out, delta_total, norm_total = {}, 0.0, 0.0
        for group, params in self.groups.items():
            delta = sum(next(values) for _ in params)
            norm = sum(next(values) for _ in params)
            out[group] = (delta / norm) ** 0.5 if norm > 0 else 0.0
            delta_total += delta
            norm_total += norm
        out["all"] = (delta_total / norm_total) ** 0.5 if norm_total > 0 else 0.0
        return out
