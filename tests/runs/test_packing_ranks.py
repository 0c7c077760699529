"""The packing check on several ranks (:mod:`harness.runs.execution.packing_decision`): each rank checks only its own
slice of
each batch (the rows the loop trains on that rank, and the same examples padded), and the ranks act on one verdict — all
pack with the same layout, all pad, or under ``train.packing: true`` all stop with the same one-line error — even when
their own checks disagree (planted here: rank 1's check fails, rank 0's passes). Two gloo ranks, spawned once for
the module, run every scenario; a tiny Qwen2 and synthetic examples keep it to seconds.
"""

from __future__ import annotations

import dataclasses
import datetime
import traceback
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist

from harness.config import LossSpec

WORLD = 2
TASKS = ["a", "b"]
PAD = 0
GLOBAL_ROWS = 8  # examples per global batch: each rank's padded slice holds GLOBAL_ROWS // WORLD of them
TIMEOUT_S = 60  # a rank left waiting in a collective fails the fixture after this, instead of hanging the suite


def _examples(n_batches: int = 3) -> list[list]:
    """Synthetic encoded examples of different lengths and two tasks (labels shifted, the prompt unsupervised)."""
    from harness.data.encoding import IGNORE_INDEX, Encoded

    rng = np.random.default_rng(0)
    batches = []
    for b in range(n_batches):
        batch = []
        for i in range(GLOBAL_ROWS):
            n = int(rng.integers(6, 20))
            ids = rng.integers(1, 64, n).astype(np.int64)
            labels = np.full(n, IGNORE_INDEX, dtype=np.int64)
            labels[3 : n - 1] = ids[4:]
            batch.append(Encoded(TASKS[(b + i) % 2], ids, labels))
        batches.append(batch)
    return batches


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)  # the same weights on every rank, as a run's model is
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    config._attn_implementation = "sdpa"  # both layouts are tried: example by example, then masked rows
    return Qwen2ForCausalLM(config)


def _plan(setting="auto"):
    from harness.data.batches import collate
    from harness.data.stage_batches import StagePlan

    train = SimpleNamespace(
        packing=setting, compile=False, loss=LossSpec(), precision="fp32", loss_chunking="auto", loss_chunk_tokens=None
    )
    examples = _examples()
    return StagePlan(SimpleNamespace(name="s", train=train), [collate(e, PAD) for e in examples], {}, examples)


def _with_check(fake, action):
    """Run ``action()`` with :func:`harness.runs.execution.packing_decision.check_packing` replaced by ``fake(real,
    *args)``."""
    from harness.runs.execution import packing_decision

    real = packing_decision.check_packing
    packing_decision.check_packing = lambda *args, **kwargs: fake(real, *args, **kwargs)
    try:
        return action()
    finally:
        packing_decision.check_packing = real


def _planted(fails_on: int, layouts=("varlen", "rows")):
    """A check that reports a leak (relative difference 1.0) on rank ``fails_on`` for the named layouts."""

    def fake(real, model, padded, packed, *args, **kwargs):
        result = real(model, padded, packed, *args, **kwargs)
        layout = "varlen" if packed[0].layout.varlen else "rows"
        if dist.get_rank() == fails_on and layout in layouts:
            return dataclasses.replace(result, max_rel_diff=1.0, leaked="attention")
        return result

    return fake


def _layout(plan, model, stored=None):
    from harness.runs.execution.packing_decision import stage_layout

    rows = []
    batches, decision = stage_layout(plan, model, TASKS, PAD, 0, lambda r, s: rows.extend(r), stored)
    return {
        "decision": decision,
        "padded": batches is plan.batches,
        "rows": [(r.metric, r.value) for r in rows],
        "batch_rows": [int(b.input_ids.shape[0]) for b in batches],
    }


# ----------------------------------------------------------------------------------------------------------------
# What each spawned rank runs (module level: torch.multiprocessing pickles it by name)
# ----------------------------------------------------------------------------------------------------------------


def _slices_seen(parallel) -> dict:
    """What the check is handed on this rank, against the slice the loop will train on here."""
    from harness.data.packed_batches import examples_of, pack_encoded

    plan, seen = _plan(), []

    def fake(real, model, padded, packed, *args, **kwargs):
        for pad_batch, pack_batch, examples in zip(padded, packed, plan.examples):
            layout = pack_batch.layout
            trained = parallel.shard(pack_encoded(examples, PAD, layout.factor, layout.varlen))
            seen.append(
                {
                    "padded_rows": int(pad_batch.input_ids.shape[0]),
                    "packed_is_the_trained_slice": torch.equal(pack_batch.input_ids, trained.input_ids)
                    and pack_batch.tasks == trained.tasks,
                    "padded_holds_its_examples": pad_batch.tasks == pack_batch.tasks
                    and all(
                        np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
                        for a, b in zip(examples_of(pad_batch), examples_of(pack_batch), strict=True)
                    ),
                }
            )
        return real(model, padded, packed, *args, **kwargs)

    return {"seen": seen, **_with_check(fake, lambda: _layout(plan, _model()))}


def _disagree_auto(parallel) -> dict:
    return _with_check(_planted(fails_on=1), lambda: _layout(_plan(), _model()))


def _disagree_on_one_layout(parallel) -> dict:
    return _with_check(_planted(fails_on=1, layouts=("varlen",)), lambda: _layout(_plan(), _model()))


def _disagree_true(parallel) -> dict:
    from harness.training.packing_check import PackingError

    try:
        _with_check(_planted(fails_on=1), lambda: _layout(_plan(True), _model()))
    except PackingError as error:
        return {"error": None, "packing_error": str(error)}
    return {"packing_error": None}


def _error_on_one_rank(parallel) -> dict:
    def fake(real, *args, **kwargs):
        if dist.get_rank() == 1:
            raise RuntimeError("planted: out of memory")
        return real(*args, **kwargs)

    try:
        _with_check(fake, lambda: _layout(_plan(), _model()))
    except RuntimeError as error:
        return {"raised": str(error)}
    return {"raised": None}


def _resumed(parallel) -> dict:
    from harness.runs.execution.packing_decision import decision

    calls = []

    def fake(real, *args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    out = _with_check(fake, lambda: _layout(_plan(), _model(), stored=decision(True, False, 4)))
    return {**out, "checks": len(calls)}


SCENARIOS = {
    "slices": _slices_seen,
    "disagree_auto": _disagree_auto,
    "disagree_on_one_layout": _disagree_on_one_layout,
    "disagree_true": _disagree_true,
    "error_on_one_rank": _error_on_one_rank,
    "resumed": _resumed,
}


def _rank_main(rank: int, root: Path) -> None:
    """Every scenario on this rank, then a last all-gather (ranks left out of step by a scenario would mismatch or
    time out there); a scenario that raises leaves its traceback as its result."""
    from harness.training.parallel import ddp

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    dist.init_process_group(
        "gloo", init_method=f"file://{root / 'store'}", rank=rank, world_size=WORLD, timeout=timeout
    )
    out = {}
    try:
        with ddp.active() as parallel:
            for name, scenario in SCENARIOS.items():
                try:
                    out[name] = scenario(parallel)
                except Exception:
                    out[name] = {"error": traceback.format_exc()}
            out["in_step"] = parallel.all_gather(rank) == list(range(WORLD))
    finally:
        dist.destroy_process_group()
    torch.save(out, root / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Two gloo ranks run every scenario above once; their results, in rank order."""
    import torch.multiprocessing as mp

    root = tmp_path_factory.mktemp("packing_ranks")
    mp.spawn(_rank_main, args=(root,), nprocs=WORLD, join=True)
    return [torch.load(root / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def _results(ranks: list[dict], scenario: str) -> list[dict]:
    for rank in ranks:
        assert rank[scenario].get("error") is None, rank[scenario]["error"]
    return [rank[scenario] for rank in ranks]


# ----------------------------------------------------------------------------------------------------------------
# The tests
# ----------------------------------------------------------------------------------------------------------------


def test_each_rank_checks_only_the_slice_it_trains(ranks):
    results = _results(ranks, "slices")
    for rank in results:
        assert rank["seen"], "the check did not run"
        assert {s["padded_rows"] for s in rank["seen"]} == {GLOBAL_ROWS // WORLD}  # never the global batch
        assert all(s["packed_is_the_trained_slice"] and s["padded_holds_its_examples"] for s in rank["seen"])
    assert results[0]["decision"] == results[1]["decision"] and results[0]["decision"]["packed"]
    assert all(r["in_step"] for r in ranks)


def test_a_check_failing_on_one_rank_pads_every_rank(ranks):
    results = _results(ranks, "disagree_auto")
    assert [r["padded"] for r in results] == [True, True]
    assert results[0]["decision"] == results[1]["decision"] == {"packed": False, "varlen": False, "factor": None}
    # every rank records the same verdict: the failing rank's figures
    assert results[0]["rows"] == results[1]["rows"] and dict(results[0]["rows"])["packed"] == 0.0
    assert dict(results[0]["rows"])["packing_max_rel_diff"] == 1.0


def test_ranks_agree_on_the_layout_when_one_fails_only_the_first(ranks):
    results = _results(ranks, "disagree_on_one_layout")
    assert results[0]["decision"] == results[1]["decision"] == {"packed": True, "varlen": False, "factor": 4}
    assert results[0]["batch_rows"] == results[1]["batch_rows"]  # the same global batches, sharded by the loop
    assert results[0]["rows"] == results[1]["rows"]


def test_packing_true_stops_every_rank_with_the_same_one_line_error(ranks):
    results = _results(ranks, "disagree_true")
    messages = [r["packing_error"] for r in results]
    assert messages[0] is not None and messages[0] == messages[1], messages  # PackingError: exit 2 (cli/errors.py)
    assert "\n" not in messages[0] and "on rank 1's slice" in messages[0]
    assert all(r["in_step"] for r in ranks)  # no rank left waiting in a collective


def test_a_check_that_raises_on_one_rank_stops_the_others_too(ranks):
    results = _results(ranks, "error_on_one_rank")
    assert "planted: out of memory" in results[1]["raised"]
    assert results[0]["raised"] is not None and "rank 1" in results[0]["raised"]


def test_a_resumed_stage_uses_its_stored_layout_without_a_check(ranks):
    results = _results(ranks, "resumed")
    assert [r["checks"] for r in results] == [0, 0]
    assert all(r["decision"] == {"packed": True, "varlen": False, "factor": 4} and not r["padded"] for r in results)
    assert results[0]["rows"] == results[1]["rows"] == []


def test_in_one_process_the_check_sees_the_whole_batch_as_before():
    """One process: the check is handed the plan's padded batches (equal, tensor for tensor) and the whole packed
    batches, so one-process runs check, record and decide exactly as before ranks checked their slices."""
    from harness.data.packed_batches import pack_encoded

    plan, seen = _plan(), []

    def fake(real, model, padded, packed, *args, **kwargs):
        seen.append((padded, packed))
        return real(model, padded, packed, *args, **kwargs)

    out = _with_check(fake, lambda: _layout(plan, _model()))
    assert out["decision"] == {"packed": True, "varlen": True, "factor": None}
    padded, packed = seen[0]
    for mine, planned in zip(padded, plan.batches, strict=False):
        for field in ("input_ids", "attention_mask", "labels", "supervised"):
            assert torch.equal(getattr(mine, field), getattr(planned, field)), field
        assert mine.tasks == planned.tasks
    for mine, examples in zip(packed, plan.examples, strict=False):
        assert torch.equal(mine.input_ids, pack_encoded(examples, PAD, None, True).input_ids)
