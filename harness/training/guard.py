"""The non-finite guard: catch a NaN/Inf loss or gradient at the step it happens, and say where it came from.

Every step's verdict is first a flag on the training device, made from what the step computes anyway: the loss and
the total gradient norm that clipping needs (a NaN or Inf in any gradient makes that norm non-finite). In one
process with a fused AdamW the optimiser reads the flag itself (``found_inf``, as ``GradScaler`` hands it) and
leaves a flagged step's weights, moments and step count untouched, so the host never waits for the step's result;
it reads the flag later (:class:`Verdict`), when the device's queue is ahead of it. Otherwise (several ranks, which
must agree; an optimiser without ``found_inf``) the host reads the flag before the update, as one sync.

On detection the offending batch is run again with forward hooks on every module, which name the *first* module
(in execution order) whose output is non-finite; the parameters whose gradients are non-finite come from the
backward pass that just ran. Mainstream trainers log NaN losses and carry on, and a ``loss > threshold`` watchdog
never fires on NaN (every comparison with NaN is false) — hence a guard that checks ``isfinite`` explicitly.

``debug.inject_nonfinite`` makes a chosen module's output (``where: forward``) or a chosen parameter's gradient
(``where: grad``) non-finite at a chosen step, so the guard can be seen to work.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from harness.training import parallel as distributed
from harness.training.health import gathered
from harness.training.parallel import SingleProcess


class NonFiniteError(RuntimeError):
    """Training stopped on a non-finite loss or gradient; ``report`` says where."""

    def __init__(self, report: dict[str, Any]):
        self.report = report
        super().__init__(format_nonfinite_report(report))

    def __reduce__(self):  # pickles with its constructor's arguments (harness repro --jobs sends it back)
        return type(self), (self.report,)


def format_nonfinite_report(report: dict[str, Any]) -> str:
    """One line for a non-finite report: what went non-finite where, the first bad module, the bad gradients."""
    params = report.get("nonfinite_grads") or []
    shown = ", ".join(params[:5]) + (f" … ({len(params)} in all)" if len(params) > 5 else "")
    return (
        f"non-finite {report['what']} at step {report['step']} (stage {report['stage']!r}); "
        f"first non-finite module output: {report.get('first_module') or 'none (forward was finite)'}; "
        f"parameters with non-finite gradients: {shown or 'none'}; tasks in the batch: "
        + ", ".join(f"{t}×{n}" for t, n in sorted(report.get("tasks", {}).items()))
    )


def first_nonfinite_module(model, run_forward) -> str | None:
    """Run ``run_forward()`` with hooks on every module; the name of the first whose output is non-finite."""
    found: list[str] = []
    handles = []

    def hook(name):
        def check(module, inputs, output):
            if found:
                return
            tensors = output if isinstance(output, (tuple, list)) else (output,)
            for t in tensors:
                if isinstance(t, torch.Tensor) and t.is_floating_point() and not torch.isfinite(t).all():
                    found.append(name)
                    return

        return check

    for name, module in model.named_modules():
        if name:
            handles.append(module.register_forward_hook(hook(name)))
    try:
        with torch.no_grad():
            run_forward()
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else None


def nonfinite_grads(model) -> list[str]:
    # A sharded (FSDP) gradient counts its non-finite entries on every rank's shard (a sum every rank computes).
    return [
        name
        for name, p in model.named_parameters()
        if p.grad is not None and int(gathered((~torch.isfinite(p.grad)).sum())) > 0
    ]


def found_nonfinite(loss: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
    """1.0 (float32, on the training device) when the loss or the total gradient norm is NaN/Inf, else 0.0: the
    ``found_inf`` a fused optimiser reads on the device."""
    return (~torch.isfinite(loss.detach().float()) | ~torch.isfinite(grad_norm.detach().float())).float()


@dataclass
class Verdict:
    """One step's outcome as the guard knows it: the host's flags (``loss_bad``, ``grad_bad``, the ranks where it
    began) when read before the update, else the device's flag, read on :meth:`read`."""

    host: tuple[bool, bool, list[int]] | None = None
    found: torch.Tensor | None = None
    loss: torch.Tensor | None = None
    grad_norm: torch.Tensor | None = None

    def read(self) -> tuple[bool, bool, list[int]]:
        if self.host is None:  # a finite step costs one read of one number; a flagged one says which was bad
            bad = bool(self.found.item())
            self.host = (
                (not bool(torch.isfinite(self.loss).item()), not bool(torch.isfinite(self.grad_norm).item()), [])
                if bad
                else (False, False, [])
            )
        return self.host


FINITE = Verdict(host=(False, False, []))  # the verdict of a step the guard does not look at (nonfinite: off)


class StepGuard:
    """Clips and applies one step's update unless the step is non-finite, and says so in a :class:`Verdict`.

    ``defers``: the flag is decided on the device (one process, fused optimiser) and the loop may read it as late as
    the next step (:meth:`Verdict.read`); otherwise it is read on the host before the update."""

    def __init__(self, action: str, parallel, optimizer, may_defer: bool = True):
        self.on = action != "off"
        self.parallel = parallel
        fused = bool(optimizer.defaults.get("fused"))
        self.on_device = self.on and fused and isinstance(parallel, SingleProcess)
        self.defers = self.on_device and may_defer

    def step(self, optimizer, loss: torch.Tensor, grad_norm: torch.Tensor, params: list, max_norm: float) -> Verdict:
        if not self.on:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, grad_norm)
            optimizer.step()
            return FINITE
        found = found_nonfinite(loss, grad_norm)
        # A non-finite norm would make the clip coefficient NaN (or 0) and smear NaN over every gradient, and the
        # report names the parameters whose gradients were bad: a flagged step clips by a norm of 0 (coefficient
        # clamped to 1, gradients untouched). A finite step's norm passes through unchanged, bit for bit.
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, torch.where(found.bool(), 0.0, grad_norm))
        if self.on_device:
            optimizer.found_inf = found  # the fused kernel skips the update and undoes its step count on the device
            try:
                optimizer.step()
            finally:
                del optimizer.found_inf
            return Verdict(found=found, loss=loss.detach(), grad_norm=grad_norm.detach())
        loss_bad, grad_bad = (~torch.isfinite(torch.stack([loss.detach().float(), grad_norm.float()]))).tolist()
        bad_ranks = self.parallel.bad_ranks(loss_bad, grad_bad)  # with several ranks, one host sync per step
        if not (loss_bad or grad_bad or bad_ranks):
            optimizer.step()
        return Verdict(host=(loss_bad, grad_bad, bad_ranks))


class NoFaults:
    """The injector of a run that injects nothing (no ``debug.inject_nonfinite``): every hook a no-op."""

    needs_eager: ClassVar[bool] = False  # no forward hooks: a compiled stage is fine

    def before_forward(self, model, step: int) -> None:
        pass

    def after_backward(self, model, step: int) -> None:
        pass

    def remove(self) -> None:
        pass


@dataclass
class Injector:
    """Makes a forward output or a gradient non-finite at one global step (``debug.inject_nonfinite``)."""

    needs_eager: ClassVar[bool] = True  # its faults are forward hooks, which a compiled module would not run

    step: int
    where: str  # forward | grad
    module: str  # regex over module (forward) or parameter (grad) names
    repeat: int = 1
    rank: int | None = None  # data-parallel runs: only this rank injects
    _handle: Any = field(default=None, repr=False)

    def active(self, step: int) -> bool:
        here = distributed.current()
        on_this_rank = self.rank is None or (here.rank if here is not None else 0) == self.rank
        return on_this_rank and self.step <= step < self.step + self.repeat

    def before_forward(self, model, step: int) -> None:
        if self.where != "forward" or not self.active(step):
            return
        self.remove()  # the guard re-runs a flagged step's forward after the next step's may have hooked in
        name, module = next(((n, m) for n, m in model.named_modules() if n and re.search(self.module, n)), (None, None))
        if module is None:
            raise ValueError(f"debug.inject_nonfinite.module: no module matches {self.module!r}")

        def poison(mod, inputs, output):
            if isinstance(output, torch.Tensor):
                return output * float("nan")
            return (output[0] * float("nan"), *output[1:])

        self._handle = module.register_forward_hook(poison)  # kept through the guard's re-run; removed after

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def after_backward(self, model, step: int) -> None:
        if self.where != "grad" or not self.active(step):
            return
        for name, p in model.named_parameters():
            if p.grad is not None and re.search(self.module, name):
                p.grad.fill_(float("nan"))
                return
        raise ValueError(f"debug.inject_nonfinite.module: no parameter with a gradient matches {self.module!r}")


def write_report(run_dir: Path | None, report: dict[str, Any]) -> None:
    if run_dir is None:
        return
    from harness.core.store import atomic_write_text

    atomic_write_text(Path(run_dir) / "nonfinite.json", json.dumps(report, indent=2))
