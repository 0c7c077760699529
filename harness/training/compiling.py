"""``train.compile``: whether a stage's training forward goes through ``torch.compile``, and the wrapper that does it.

``auto`` (the default) compiles a CPU stage of at least :data:`AUTO_COMPILE_MIN_STEPS` steps when this process can
compile (TorchDynamo supports this Python, and Inductor's C++ compiler is there); GPU stages stay eager under
``auto`` — the threshold and the cost of deterministic kernels were measured on CPUs only (set ``true`` on a GPU).
``true`` always compiles (and stops at once, before training, when no toolchain is found: a C++ compiler on a CPU,
Triton on a GPU), ``false`` never. The decision is a function of the stage's spec and
the machine only, never of timing, so a run and its ``--resume`` (and a stage-cache key,
:func:`harness.runs.planning.stage_key.stage_keys`) agree on it: compiled kernels reorder float sums, so a compiled
stage's
numbers differ from an eager one's in the last bits.

The threshold is where compiling pays for its one-off cost on a CPU, from ``bench/compile_cost.py`` and
``bench/train_speed.py``; the measurements (machine, date, break-even in steps) are in ``docs/performance.md``.

When compiling fails at the wrap or at the first call (no working C++ compiler, an operator Inductor does not
support), ``auto`` trains on eagerly after one warning line — the same numbers as ``false``: the random-number state
is put back to where it was before the failed call, in case Dynamo ran part of the forward first — while ``true``
stops with :class:`CompileFailed`. Evaluation and the non-finite diagnosis keep calling the plain module: hooks must
fire there.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import weakref
from collections.abc import Iterator

import torch

AUTO_COMPILE_MIN_STEPS = 1000
log = logging.getLogger(__name__)
# Fallbacks so far in this process (the stage cache keeps no stage trained after one: its key says compiled).
fallbacks = 0


class CompileFailed(RuntimeError):
    """``train.compile: true`` and ``torch.compile`` failed."""


@functools.cache
def can_compile(device_type: str) -> bool:
    """Whether ``torch.compile``'s default backend has what it needs here (checked once, without compiling)."""
    try:
        import torch._dynamo

        if not torch._dynamo.is_dynamo_supported():
            return False
        if device_type == "cuda":
            from torch.utils._triton import has_triton

            return has_triton()
        from torch._inductor import config

        names = [os.environ.get("CXX")] + list(config.cpp.cxx)
        return any(name and shutil.which(name) for name in names)
    except Exception:  # noqa: BLE001 — a torch without these internals: let auto stay eager
        return False


def compile_decision(setting: bool | str, steps: int, device_type: str) -> bool:
    """Whether a stage of ``steps`` steps with ``train.compile: setting`` compiles its training forward; raises
    :class:`CompileFailed` for ``true`` where no toolchain is found (before any training, not at the first step of
    a stage hours in)."""
    if setting == "auto":
        return device_type == "cpu" and steps >= AUTO_COMPILE_MIN_STEPS and can_compile(device_type)
    if setting is True and not can_compile(device_type):
        raise CompileFailed(
            f"train.compile: true, but torch.compile cannot run on {device_type} here (no "
            f"{'Triton' if device_type == 'cuda' else 'working C++ compiler'} found, or a Python "
            "TorchDynamo does not support); set train.compile to auto (falls back to eager) or false"
        )
    return bool(setting)


# Inside a compiled stage (``compiled_stage``), and the deterministic-algorithms settings found before turning
# them on (restored at the stage's end, or on a fallback).
_in_compiled_stage = False
_before: tuple[bool, bool, bool] | None = None


@contextlib.contextmanager
def compiled_stage(compiled: bool) -> Iterator[None]:
    """Around a stage whose forward is compiled: from its first compiled call, deterministic algorithms are on
    (``warn_only``: an op without a deterministic kernel warns instead of failing), until the stage ends. Inductor
    lowers a scatter-add — the embedding's backward — to atomic adds unless they are on, and two compiled runs of
    one stage then differ in the last bits (measured: docs/performance.md, Compiling); with them on it calls ATen's
    kernel, and a compiled stage is as
    reproducible as an eager one (a resume, a stage-cache replay). A stage that never calls the compiled forward
    (image batches) runs as it would without."""
    global _in_compiled_stage
    _in_compiled_stage = compiled
    try:
        yield
    finally:
        _in_compiled_stage = False
        _leave_deterministic()


def _enter_deterministic() -> None:
    global _before
    if _in_compiled_stage and _before is None:
        _before = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.utils.deterministic.fill_uninitialized_memory,
        )
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = False  # costs time; correct code never reads it


def _leave_deterministic() -> None:
    global _before
    if _before is not None:
        enabled, warn_only, fill = _before
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill
        _before = None


class _Compiled:
    """``torch.compile(module, dynamic=True)`` for the training forward (batch length varies per step, so shapes
    are symbolic from the start instead of recompiling at the second length). A failure at the wrap or the first
    call falls back to eager (``strict``: raises :class:`CompileFailed`); later errors propagate."""

    def __init__(self, module: torch.nn.Module):
        self.module, self.compiled, self.called, self.error, self.warned = module, None, False, None, False
        try:
            self.compiled = torch.compile(module, dynamic=True)
        except Exception as error:  # noqa: BLE001 — e.g. a Python that TorchDynamo does not support
            self.error = error

    def __call__(self, *args, strict: bool = False, **kwargs):
        if self.error is None:
            _enter_deterministic()  # before the first call: the backward is lowered (lazily) under it too
        if self.error is None and not self.called:
            rng = _rng_state()
            try:
                out = self.compiled(*args, **kwargs)
                self.called = True
                return out
            except Exception as error:  # noqa: BLE001 — any compiler failure
                self.error = error
                _restore_rng(rng)  # Dynamo may have run a graph before the failing one: draw nothing twice
        if self.error is None:
            return self.compiled(*args, **kwargs)
        if strict:
            raise CompileFailed(
                f"train.compile: true, but torch.compile failed ({_describe(self.error)}); set "
                "train.compile to auto (falls back to eager) or false"
            ) from self.error
        _leave_deterministic()  # eager exactly as a stage that never compiled
        if not self.warned:  # say why once, then eager without retrying
            global fallbacks
            self.warned, fallbacks = True, fallbacks + 1
            log.warning("train.compile: torch.compile failed (%s); training without it", _describe(self.error))
        return self.module(*args, **kwargs)


def _rng_state() -> tuple:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.random.get_rng_state(), cuda


def _restore_rng(state: tuple) -> None:
    cpu, cuda = state
    torch.random.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def _describe(error: Exception) -> str:
    first = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {first}"


# One compiled wrapper per module, reused by every stage (a weak map, not an attribute: an attribute would register
# the wrapper as a submodule and put it in state dicts and checkpoints).
_COMPILED: weakref.WeakKeyDictionary[torch.nn.Module, _Compiled] = weakref.WeakKeyDictionary()


def forward_of(module: torch.nn.Module, compiled: bool | str):
    """``module``'s training forward: itself (``compiled`` false), or its compiled wrapper, which falls back to
    eager on a compile failure under ``"auto"`` and raises :class:`CompileFailed` under ``True``."""
    if not compiled:
        return module
    if module not in _COMPILED:
        _COMPILED[module] = _Compiled(module)
    return functools.partial(_COMPILED[module], strict=compiled is True)
