"""The non-finite guard: catch a NaN/Inf loss or gradient at the step it happens, and say where it came from.

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
from typing import Any, ClassVar, Optional

import torch

from harness.training import parallel as distributed
from harness.training.health import gathered


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


def first_nonfinite_module(model, run_forward) -> Optional[str]:
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
    rank: Optional[int] = None  # data-parallel runs: only this rank injects
    _handle: Any = field(default=None, repr=False)

    def active(self, step: int) -> bool:
        here = distributed.current()
        on_this_rank = self.rank is None or (here.rank if here is not None else 0) == self.rank
        return on_this_rank and self.step <= step < self.step + self.repeat

    def before_forward(self, model, step: int) -> None:
        if self.where != "forward" or not self.active(step):
            return
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


def write_report(run_dir: Optional[Path], report: dict[str, Any]) -> None:
    if run_dir is None:
        return
    from harness.core.store import atomic_write_text

    atomic_write_text(Path(run_dir) / "nonfinite.json", json.dumps(report, indent=2))
