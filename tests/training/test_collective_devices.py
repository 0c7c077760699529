"""Every tensor the harness hands a collective lives on the device the process group expects, checked in process:
the hooks of :class:`harness.training.parallel.ddp.DataParallel` and the adaptive mixture's sums
(:class:`harness.training.steering.Steering`); and an inventory of every collective call in ``harness/``, each
paired with the test that checks it here or the reason it hands no tensor of ours.

Why ``meta``: NCCL (GPUs) refuses CPU tensors, gloo takes anything, and on a CPU-only machine every tensor is on
the CPU, so a tensor made on the wrong device cannot be seen by running. A model on the ``meta`` device can: the
hooks must take their device from the model (:meth:`DataParallel.trained_module`), and a recorder standing in for
``torch.distributed.all_reduce`` sees where each tensor it is handed lives. The two-rank half (the real loop and a
resumed adaptive update on gloo, every collective recorded) is tests/training/test_collectives.py. The packing
check's verdicts go through the hooks' object ``all_gather`` (its site is in the inventory): what they hand it is
checked here to be plain values.

Not in the inventory, because torch makes those calls itself on the device of what it was given: DDP's gradient
all-reduce (``device_ids`` from the model), and FSDP2's all-gathers and reduce-scatters (``fully_shard``,
``get_model_state_dict``, ``set_optimizer_state_dict``) over the parameters' device mesh.
"""

from __future__ import annotations

import ast
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist

from harness.training.parallel.single import SingleProcess
from harness.training.steering import Steering
from tests.conftest import ROOT

_OBJECTS = (
    "an object collective: it pickles plain values and CPU tensors (RNG states, lists), and torch puts the bytes "
    "on torch.cuda.current_device(), which process_group sets to the rank's GPU"
)
# Every collective call in harness/ as (file, enclosing function, collective): the test here that checks the device
# of what it is handed, or why there is nothing of ours to place.
SITES = {
    ("harness/training/parallel/ddp.py", "global_mean", "all_reduce"): "test_global_mean_reduces_on_the_losses_device",
    ("harness/training/parallel/ddp.py", "sum_window", "all_reduce"): (
        "test_sum_window_reduces_on_the_models_device_even_without_a_successful_step"
    ),
    ("harness/training/parallel/ddp.py", "all_reduce_sum", "all_reduce"): (
        "test_steering_sums_made_elsewhere_still_reach_the_collective_on_the_hooks_device"
    ),
    ("harness/training/parallel/ddp.py", "bad_ranks", "all_reduce"): "test_bad_ranks_flags_live_on_the_models_device",
    ("harness/training/parallel/ddp.py", "gather", "gather_object"): _OBJECTS,
    ("harness/training/parallel/ddp.py", "all_gather", "all_gather_object"): _OBJECTS,
    ("harness/training/parallel/ddp.py", "report_of", "broadcast_object_list"): _OBJECTS,
    ("harness/training/parallel/ddp.py", "active", "barrier"): "a barrier hands no tensor (NCCL's uses the current "
    "device, which process_group sets)",
}
COLLECTIVES = {
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
}
TASKS = ["a", "b"]


class _Handed(Exception):
    """Raised by the recorder on a meta tensor (a meta tensor has no values to reduce), carrying its device."""

    def __init__(self, device):
        super().__init__(str(device))
        self.device = device


@pytest.fixture
def meta_hooks(tmp_path, monkeypatch):
    """One in-process gloo rank whose hooks trained a model on ``meta``, and ``torch.distributed.all_reduce``
    replaced by a recorder that raises :class:`_Handed` when given a meta tensor (and reduces the others)."""
    from harness.training.parallel.ddp import DataParallel

    real = dist.all_reduce

    def recorder(tensor, *args, **kwargs):
        if tensor.device.type == "meta":
            raise _Handed(tensor.device)
        return real(tensor, *args, **kwargs)

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    monkeypatch.setattr(dist, "all_reduce", recorder)
    try:
        parallel = DataParallel()
        with torch.device("meta"):
            model = torch.nn.Linear(4, 4)
        assert parallel.trained_module(model, "fp32") is model
        yield parallel
    finally:
        dist.destroy_process_group()


# -- the data-parallel hooks ----------------------------------------------------------------------------------------


def test_bad_ranks_flags_live_on_the_models_device(meta_hooks):
    with pytest.raises(_Handed) as handed:
        meta_hooks.bad_ranks(False, True)
    assert handed.value.device.type == "meta"


def test_sum_window_reduces_on_the_models_device_even_without_a_successful_step(meta_hooks):
    from harness.training.loop import Window

    window = Window(3)  # no successful step: its sums are still the CPU zeros it was made with
    assert window.loss_sum.device.type == "cpu"
    with pytest.raises(_Handed) as handed:
        meta_hooks.sum_window(window)
    assert handed.value.device.type == "meta"


def test_global_mean_reduces_on_the_losses_device(meta_hooks):
    per_token = torch.ones(5, device="meta")
    with pytest.raises(_Handed):
        meta_hooks.global_mean(per_token, torch.ones(5, device="meta"))
    with pytest.raises(_Handed):
        meta_hooks.global_mean(per_token, None)


# -- an adaptive mixture's per-task sums ----------------------------------------------------------------------------


class StubStream:
    """What :class:`Steering` reads of an adaptive stream: its tasks, when it updates, the losses it observes."""

    tasks = ["b", "a"]
    spec = SimpleNamespace(every=1)

    def updates_after(self, batch_index: int) -> bool:
        return True  # every: 1

    def __init__(self):
        self.observed: list[list[float]] = []

    def observe(self, losses) -> None:
        self.observed.append(np.asarray(losses).tolist())

    def weights(self) -> np.ndarray:
        return np.array([0.5, 0.5])


RESUMED = {"loss_sum": [1.0, 2.0], "token_count": [1.0, 1.0]}  # a resume point's partial sums (plain lists)


def test_steering_sums_are_made_on_the_training_device_a_resumed_stages_too():
    device = torch.device("meta")
    fresh = Steering(StubStream(), TASKS, "s", SingleProcess(), device)
    resumed = Steering(StubStream(), TASKS, "s", SingleProcess(), device, RESUMED)
    assert {t.device for s in (fresh, resumed) for t in (s.loss_sum, s.token_count)} == {device}


def test_steering_reduces_on_the_hooks_device_before_its_first_trained_step(meta_hooks):
    """The stage's first step was skipped (non-finite): the update comes before any ``add``."""
    steering = Steering(StubStream(), TASKS, "s", meta_hooks, torch.device("meta"))
    with pytest.raises(_Handed) as handed:
        steering.after_step(0, 1)
    assert handed.value.device.type == "meta"


def test_steering_sums_made_elsewhere_still_reach_the_collective_on_the_hooks_device(meta_hooks):
    """The reduction itself puts what it hands the collective on the hooks' device (sums made on the CPU, as a
    resume point's lists were loaded before)."""
    steering = Steering(StubStream(), TASKS, "s", meta_hooks, torch.device("cpu"), RESUMED)
    with pytest.raises(_Handed) as handed:
        steering.after_step(0, 1)
    assert handed.value.device.type == "meta"


def test_one_process_steering_observes_the_resumed_sums_in_the_streams_task_order():
    stream = StubStream()
    rows = Steering(stream, TASKS, "s", SingleProcess(), torch.device("cpu"), RESUMED).after_step(0, 1)
    assert stream.observed == [[2.0, 1.0]] and [r.task for r in rows] == ["b", "a"]


# -- the packing check's verdicts -----------------------------------------------------------------------------------


def _holds_a_tensor(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = [getattr(value, f.name) for f in dataclasses.fields(value)]
    elif isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    return isinstance(value, (list, tuple, set)) and any(_holds_a_tensor(v) for v in value)


def test_packing_verdicts_are_exchanged_as_plain_values(meta_hooks, monkeypatch):
    """Ranks agree on the packing check (:mod:`harness.runs.execution.packing_decision`) through the hooks'
    ``all_gather``, an
    object collective: what it pickles must hold no tensor (a tensor on the GPU would be pickled from there, one on the
    CPU would be fine under gloo and is not what the inventory above allows for), and it is the only collective the
    stage's decision calls. Two real ranks agreeing: tests/runs/test_packing_ranks.py."""
    from harness.runs.execution.packing_decision import stage_layout
    from harness.training.parallel import ddp
    from tests.runs.test_packing_ranks import PAD, TASKS, _model, _plan

    gathered, real = [], dist.all_gather_object
    monkeypatch.setattr(ddp, "_CURRENT", meta_hooks)  # the run's hooks, as under ddp.active()
    monkeypatch.setattr(dist, "all_gather_object", lambda out, obj, *a, **k: (gathered.append(obj), real(out, obj)))
    monkeypatch.setattr(dist, "all_reduce", lambda *a, **k: pytest.fail("the decision all-reduced a tensor"))
    _, decision = stage_layout(_plan(), _model(), TASKS, PAD, 0, None)
    assert decision["packed"] and gathered
    assert not any(_holds_a_tensor(obj) for obj in gathered), gathered


# -- every collective call site -------------------------------------------------------------------------------------


def _collective_calls() -> set[tuple[str, str, str]]:
    """``(file, enclosing function, collective)`` of every ``dist.X(...)`` / ``torch.distributed.X(...)`` call."""
    found = set()
    for path in sorted((ROOT / "harness").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()

        def visit(node: ast.AST, function: str, rel: str = rel) -> None:
            for child in ast.iter_child_nodes(node):
                inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
                if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                    owner = ast.unparse(child.func.value)
                    if owner in ("dist", "torch.distributed") and child.func.attr in COLLECTIVES:
                        found.add((rel, function, child.func.attr))
                visit(child, inner)

        visit(ast.parse(path.read_text(), filename=rel), "<module>")
    return found


def test_every_collective_call_in_the_harness_is_checked_here_or_says_why_not():
    assert _collective_calls() == set(SITES), "a collective call was added or moved: pair it with a test in SITES"
    for site, check in SITES.items():
        if check.startswith("test_"):
            assert callable(globals().get(check)), (site, check)
        else:
            assert len(check) > 20, site
