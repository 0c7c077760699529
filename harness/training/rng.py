"""The random generators a run saves and restores, per process (so per data-parallel rank): torch's CPU generator,
this process's own accelerator generator, numpy's and Python's global generators.

"Own" matters with several ranks on GPUs: each rank computes on one CUDA device (``LOCAL_RANK``) and its dropout
draws from that device's generator in its own process. ``torch.cuda.get_rng_state_all()`` in rank 0 returns rank
0's view of every device (the generators of devices it never used still at their seed), not the other ranks' states,
so a rank restores the state it captured itself: :func:`device_state` / :func:`set_device_state` read and set
the generator of the device this process computes on (``torch.cuda.current_device()``, which
:func:`harness.training.parallel.ddp.process_group` sets to ``LOCAL_RANK``).

Every state is made of tensors, lists, ints, floats, strings and None, so ``torch.load(weights_only=True)`` reads
it back (numpy's key array is stored as a list).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def device_state() -> torch.Tensor | None:
    """The state of this process's own CUDA generator (its current device), None without CUDA."""
    return torch.cuda.get_rng_state() if torch.cuda.is_available() else None


def set_device_state(state: torch.Tensor | None) -> None:
    """Set this process's own CUDA generator (its current device); nothing when ``state`` is None or no CUDA."""
    if state is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state)


def numpy_state() -> list:
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return [name, keys.tolist(), int(pos), int(has_gauss), float(gauss)]


def set_numpy_state(state: list) -> None:
    name, keys, pos, has_gauss, gauss = state
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))


def python_state() -> list:
    version, state, gauss_next = random.getstate()
    return [version, list(state), gauss_next]


def set_python_state(state: list) -> None:
    version, inner, gauss_next = state
    random.setstate((version, tuple(inner), gauss_next))


def capture() -> dict[str, Any]:
    """Every generator of this process: ``torch`` (CPU), ``device`` (its own CUDA device, or None), ``numpy``,
    ``python``."""
    return {"torch": torch.get_rng_state(), "device": device_state(), "numpy": numpy_state(), "python": python_state()}


def restore(state: dict[str, Any]) -> None:
    """Set this process's generators from :func:`capture` (a key that is absent is left as it is)."""
    if state.get("torch") is not None:
        torch.set_rng_state(state["torch"])
    set_device_state(state.get("device"))
    if state.get("numpy") is not None:
        set_numpy_state(state["numpy"])
    if state.get("python") is not None:
        set_python_state(state["python"])
