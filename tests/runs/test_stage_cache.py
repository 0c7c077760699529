"""The stage cache (harness.runs.execution.stage_cache): a run that starts from cached stages gives bit-identical store
values,
samples and checkpoints to the same run computed whole (a LoRA adapter continued across the cache boundary, an
``init: <stage>``, and a run interrupted after a replayed stage and resumed included); a field that shapes a stage
misses (every field of the schema: tests/runs/test_stage_cache_key.py); corrupt entries are rebuilt; concurrent writers
are safe; housekeeping lists, sizes and prunes."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from pathlib import Path

import polars as pl
import pytest
import torch
from safetensors.torch import load_file

from harness.config import Experiment
from harness.core.store import read_metrics
from harness.data.task_data import task_data_hash
from harness.runs.execution.cache_housekeeping import list_entries, prune
from harness.runs.execution.runner import run_experiment
from harness.runs.execution.stage_cache import _publish, read_entry
from harness.runs.planning.prepare import build_task_data
from harness.runs.planning.stage_key import stage_keys
from harness.training import compiling
from tests.conftest import invoke

WALL_CLOCK = ["tokens_per_s"]  # the only values that may differ between two identical runs


@pytest.fixture
def cache(tmp_path, monkeypatch, _isolated_cache) -> Path:
    """A stage cache of this test's own; the session's pretrained bases are linked in (not pretrained again)."""
    root = tmp_path / "cache"
    root.mkdir()
    (_isolated_cache / "base").mkdir(exist_ok=True)
    (root / "base").symlink_to(_isolated_cache / "base", target_is_directory=True)
    monkeypatch.setenv("HARNESS_CACHE", str(root))
    return root / "stages"


def _four_stages(tiny: dict) -> dict:
    """Full fine-tuning, then LoRA, then the same LoRA continued, then a stage restarting from the first one."""
    exp = copy.deepcopy(tiny)
    lora = {"mode": "lora", "r": 4, "adapter": "continue"}
    exp["stages"] = [
        {"name": "a", "steps": 4, "mixture": {"repeat": 1.0}},
        {"name": "b", "steps": 4, "mixture": {"repeat": 0.5, "yesno": 0.5}, "trainable": lora},
        {"name": "c", "steps": 4, "mixture": {"yesno": 0.5, "math": 0.5}, "trainable": dict(lora)},
        {"name": "d", "steps": 3, "init": "a", "mixture": {"math": 1.0}},
    ]
    exp["train"]["log_every"] = 3
    exp["eval"]["every"] = 3
    return exp


def _run(spec: dict, out: Path, stage_cache=True):
    spec = copy.deepcopy(spec)
    spec["train"]["stage_cache"] = stage_cache
    return run_experiment(Experiment.model_validate(spec), out)


def _values(run_dir: Path) -> pl.DataFrame:
    return (
        read_metrics(run_dir)
        .filter(~pl.col("metric").is_in(WALL_CLOCK))
        .select("stage", "step", "task", "split", "metric", "value", "text", "n", "ci_low", "ci_high")
    )


def _samples(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    for r in rows:
        r.pop("cached_from", None)
        r.pop("run_id", None)  # each run its own
    return rows


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return {name: t for f in sorted(checkpoint.rglob("*.safetensors")) for name, t in load_file(f).items()}


def test_a_run_from_cached_stages_is_bit_identical_to_the_whole_run(tiny, tmp_path, cache):
    exp = _four_stages(tiny)
    reference = _run(exp, tmp_path / "reference", stage_cache=False)
    assert not cache.exists(), "stage_cache: false writes nothing"

    first = copy.deepcopy(exp)
    first["stages"] = first["stages"][:1]
    _run(first, tmp_path / "first")  # caches a
    prefix = copy.deepcopy(exp)
    prefix["stages"] = prefix["stages"][:2]
    _run(prefix, tmp_path / "prefix")  # a from the cache, then b (its adapter drawn from the restored RNG)
    assert len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 2
    run_end = ~pl.col("metric").is_in(["seesaw", "seesaw_tests"])  # the seesaw is decided at each run's end
    assert (
        _values(tmp_path / "prefix")
        .filter(run_end)
        .equals(_values(reference.run_dir).filter(pl.col("stage").is_in(["a", "b"]) & run_end))
    )
    b_weights = _weights(tmp_path / "prefix" / "checkpoints" / "b")
    assert all(torch.equal(t, _weights(reference.run_dir / "checkpoints" / "b")[k]) for k, t in b_weights.items())

    cached = _run(exp, tmp_path / "cached")
    stages = cached.summary["stages"]
    source_a, source_b = (json.loads((tmp_path / d / "run.json").read_text())["run_id"] for d in ("first", "prefix"))
    assert [s.get("cached_from") for s in stages] == [source_a, source_b, None, None]
    assert [s["intervals"] for s in stages] == [s["intervals"] for s in reference.summary["stages"]]
    assert stages[0]["intervals"], "a replayed stage keeps its proportions' n and Wilson intervals"

    assert _values(reference.run_dir).equals(_values(cached.run_dir))  # order and every bit of every value
    assert _samples(reference.run_dir) == _samples(cached.run_dir)
    store = read_metrics(cached.run_dir)
    marked = store.filter(pl.col("cached_from").is_not_null())
    assert set(marked["stage"].unique()) == {"a", "b"}
    assert set(marked["cached_from"].unique()) == {source_a, source_b}
    assert store.filter(pl.col("stage").is_in(["c", "d"]))["cached_from"].is_null().all()
    for stage in "abcd":
        ref, got = (_weights(r.run_dir / "checkpoints" / stage) for r in (reference, cached))
        assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref), stage
    assert reference.summary["seesaw_events"] == cached.summary["seesaw_events"]

    again = _run(exp, tmp_path / "again")  # every stage cached now
    assert all(s.get("cached_from") for s in again.summary["stages"])
    assert _values(reference.run_dir).equals(_values(again.run_dir))
    assert _samples(reference.run_dir) == _samples(again.run_dir)


def _keys(spec: dict) -> list[str]:
    exp = Experiment.model_validate(spec)
    data = build_task_data(exp)
    return stage_keys(exp, "base", task_data_hash(data.splits, data.corpus), "cpu")


# Which fields miss (every field of the schema, one at a time) and the code in the key:
# tests/runs/test_stage_cache_key.py


def test_a_cpu_stage_computed_with_another_thread_count_misses(tiny):
    """Float sums follow the intra-op thread count: a 1-thread sweep worker must not replay a 2-thread run's stage
    (measured: trials replaying shared stages a 2-thread process had computed matched trials computing them in 1
    thread in 6,330 of 31,116 store values)."""
    exp = _four_stages(tiny)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _keys(exp)
        torch.set_num_threads(2)
        two = _keys(exp)
    finally:
        torch.set_num_threads(threads)
    assert all(a != b for a, b in zip(one, two))


def test_fields_that_only_say_what_to_keep_share_the_entries(tiny):
    exp = _four_stages(tiny)
    before = _keys(exp)
    exp["name"] = "renamed"
    exp["train"].update(checkpoint_every=2, keep_checkpoints=5, stage_cache="read_only")
    exp["stages"][1]["checkpoint"] = False
    exp["tracking"]["console"] = True
    assert _keys(exp) == before


def test_a_changed_lr_trains_the_stage_again(tiny, tmp_path, cache):
    exp = _four_stages(tiny)
    exp["stages"] = exp["stages"][:2]
    _run(exp, tmp_path / "first")
    exp["stages"][1]["optim"] = {"lr": 1e-3}
    second = _run(exp, tmp_path / "second")
    assert [bool(s.get("cached_from")) for s in second.summary["stages"]] == [True, False]


def test_read_only_reads_but_never_writes(tiny, tmp_path, cache):
    exp = _four_stages(tiny)
    exp["stages"] = exp["stages"][:1]
    _run(exp, tmp_path / "ro", stage_cache="read_only")
    assert not cache.exists() or not any(cache.iterdir())
    _run(exp, tmp_path / "rw")
    ro = _run(exp, tmp_path / "ro2", stage_cache="read_only")
    assert ro.summary["stages"][0].get("cached_from")


def test_a_corrupt_entry_is_ignored_with_a_warning_and_rebuilt(tiny, tmp_path, cache, caplog):
    exp = _four_stages(tiny)
    exp["stages"] = exp["stages"][:1]
    _run(exp, tmp_path / "first")
    (entry,) = [p for p in cache.iterdir() if not p.name.startswith(".")]
    rows = entry / "rows.parquet"
    rows.write_bytes(rows.read_bytes()[:-10])  # a truncated file
    assert read_entry(entry, warn=lambda message: None) is None
    second = _run(exp, tmp_path / "second")
    assert not second.summary["stages"][0].get("cached_from")
    assert read_entry(entry) is not None, "rebuilt"
    assert _values(tmp_path / "first").equals(_values(second.run_dir))


def test_two_writers_of_one_stage_keep_one_whole_entry(tmp_path):
    def finished(name: str, content: str) -> Path:
        tmp = tmp_path / name
        tmp.mkdir()
        (tmp / "x").write_text(content)
        digest = hashlib.sha256(content.encode()).hexdigest()
        (tmp / "meta.json").write_text(
            json.dumps({"parts": [], "files": {"x": {"size": len(content), "sha256": digest}}})
        )
        return tmp

    target = tmp_path / "entry"
    assert _publish(finished(".w1", "first"), target, has_checkpoint=False)
    assert not _publish(finished(".w2", "second"), target, has_checkpoint=False)  # the loser discards its copy
    assert (target / "x").read_text() == "first" and not (tmp_path / ".w2").exists()
    (target / "x").write_text("corrupted")
    assert _publish(finished(".w3", "third"), target, has_checkpoint=False)  # a corrupt entry is replaced
    assert (target / "x").read_text() == "third"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


# -- housekeeping -------------------------------------------------------------------------------------------------


def _fake_entry(root: Path, key: str, size: int, age_s: float, meta: bool = True) -> Path:
    path = root / key
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"\0" * size)
    if meta:
        (path / "meta.json").write_text(json.dumps({"experiment": "x", "stage": key, "index": 0, "end_step": 4}))
    old = time.time() - age_s
    os.utime(path, (old, old))
    return path


def test_prune_removes_old_corrupt_and_least_recently_used_entries(tmp_path):
    root = tmp_path / "stages"
    _fake_entry(root, "old", 100, age_s=8 * 86400)
    _fake_entry(root, "corrupt", 100, age_s=60, meta=False)
    _fake_entry(root, "lru", 1000, age_s=3600)
    _fake_entry(root, "recent", 1000, age_s=10)
    abandoned = root / ".writer.abc"
    abandoned.mkdir()
    os.utime(abandoned, (time.time() - 86400, time.time() - 86400))
    (root / ".writer.fresh").mkdir()  # a writer at work: left alone
    removed = prune(root, older_than_s=7 * 86400, max_size=1500)
    assert sorted(e.path.name for e in removed) == ["corrupt", "lru", "old"]
    assert [e.path.name for e in list_entries(root)] == ["recent"]
    assert sorted(p.name for p in root.iterdir()) == [".writer.fresh", "recent"]


def test_cache_cli_lists_sizes_and_rejects_bad_values(tmp_path, monkeypatch):
    # In process (typer's runner): the commands and their exit codes, without a subprocess's start-up each.
    root = tmp_path / "cache"
    _fake_entry(root / "stages", "k1", 2000, age_s=10)
    monkeypatch.setenv("HARNESS_CACHE", str(root))
    listing = invoke("cache", "ls")
    assert listing.exit_code == 0 and "k1" in listing.stdout and "x/k1" in listing.stdout
    assert "1 entries, 2.1 KB" in invoke("cache", "du").stdout
    bad = invoke("cache", "prune", "--older-than", "7 days")
    assert bad.exit_code == 2 and "--older-than '7 days'" in bad.stderr
    assert invoke("cache", "prune", "--max-size", "1KB").stdout.startswith("removed 1 entries")
    assert not (root / "stages" / "k1").exists()


class _Interrupt(Exception):
    """Stands for a kill: raised from the evaluation hook, it ends the run with the store flushed."""


def test_a_run_from_a_cached_stage_interrupted_and_resumed_is_bit_identical(tiny, tmp_path, cache):
    exp = copy.deepcopy(tiny)
    exp["stages"] = [
        {"name": "a", "steps": 4, "mixture": {"repeat": 1.0}},
        # LoRA: the adapter is drawn from the RNG the cached stage restored, and rebuilt from the resume point
        {"name": "b", "steps": 7, "mixture": {"repeat": 0.5, "yesno": 0.5}, "trainable": {"mode": "lora", "r": 4}},
    ]
    exp["train"].update(log_every=3, checkpoint_every=2)  # the loop's window resumes mid-way
    exp["eval"]["every"] = 3
    reference = _run(exp, tmp_path / "reference", stage_cache=False)
    first = copy.deepcopy(exp)
    first["stages"] = first["stages"][:1]
    _run(first, tmp_path / "first")  # caches a

    def interrupt(stage: str, step: int, rows) -> None:
        if stage == "b" and step >= 9:  # after the resume point at step 8, with rows logged past it
            raise _Interrupt

    killed = tmp_path / "killed"
    spec = copy.deepcopy(exp)
    spec["train"]["stage_cache"] = True
    with pytest.raises(_Interrupt):
        run_experiment(Experiment.model_validate(spec), killed, on_evaluation=interrupt)
    assert (killed / "checkpoints" / "a").is_dir() and not (killed / "summary.json").exists()
    trained = read_metrics(killed).filter((pl.col("stage") == "a") & (pl.col("step") > 0))  # not the baselines
    assert trained.height and trained["cached_from"].is_not_null().all(), "a replayed from the cache"
    assert sorted(p.name for p in (killed / "checkpoints" / "resume").iterdir()) == ["step-00000006", "step-00000008"]

    resumed = run_experiment(Experiment.model_validate(spec), killed, resume=True)
    assert resumed.summary["resumed_from"] == "step-00000008"
    assert _values(reference.run_dir).equals(_values(killed))
    assert _samples(reference.run_dir) == _samples(killed)
    for stage in "ab":
        ref, got = (_weights(d / "checkpoints" / stage) for d in (reference.run_dir, killed))
        assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref), stage
    assert reference.summary["seesaw_events"] == resumed.summary["seesaw_events"]


def test_the_key_holds_the_compile_decision_not_the_setting(tiny, monkeypatch):
    exp = _four_stages(tiny)
    keys = {}
    for setting in ("auto", False, True):
        exp["train"]["compile"] = setting
        keys[setting] = _keys(exp)
    assert keys["auto"] == keys[False], "short stages: auto stays eager"
    assert all(a != b for a, b in zip(keys[True], keys[False])), "compiled numbers differ in the last bits"
    monkeypatch.setattr(compiling, "AUTO_COMPILE_MIN_STEPS", 1)
    monkeypatch.setattr(compiling, "can_compile", lambda device_type: True)
    exp["train"]["compile"] = "auto"
    assert _keys(exp) == keys[True]


def test_a_run_whose_compile_fell_back_gives_eager_numbers_and_stores_nothing(
    tiny, tmp_path, cache, monkeypatch, auto_compiles, caplog
):
    def broken_compile(module, **kwargs):
        def call(*args, **kw):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

        return call

    exp = copy.deepcopy(tiny)
    # Padded batches in both runs: a stage that decides to compile trains padded batches under packing: auto
    # (docs/packing.md), so an eager run's packed float order is not what a fallen-back compiled stage computes.
    exp["train"]["packing"] = False
    exp["train"]["compile"] = False
    eager = _run(exp, tmp_path / "eager", stage_cache=False)
    monkeypatch.setattr(torch, "compile", broken_compile)
    exp["train"]["compile"] = "auto"
    with caplog.at_level("WARNING", logger="harness.training.compiling"):
        fell_back = _run(exp, tmp_path / "fell_back")
    assert caplog.text.count("torch.compile failed (RuntimeError: InvalidCxxCompiler") == 1
    assert _values(eager.run_dir).equals(_values(fell_back.run_dir))
    assert _samples(eager.run_dir) == _samples(fell_back.run_dir)
    assert not cache.exists() or not [p for p in cache.iterdir() if not p.name.startswith(".")], (
        "its stages ran eagerly under keys that say compiled"
    )


def test_a_pruned_trial_counts_the_steps_it_replayed(tmp_path):
    """``cached_steps`` comes from the trial's store, so a trial pruned (no summary) still reports its replay."""
    import polars as pl

    from harness.core.store import SCHEMA
    from harness.studies.sweep.worker import cached_steps

    assert cached_steps(tmp_path) == 0  # no store yet
    rows = [
        {"step": step, "metric": "loss", "value": 1.0, "cached_from": source}
        for step, source in ((0, None), (300, "run-a"), (800, "run-a"), (900, None))
    ]
    frame = pl.DataFrame([{name: r.get(name) for name in SCHEMA} for r in rows], schema=SCHEMA)
    frame.write_parquet(tmp_path / "metrics.parquet")
    assert cached_steps(tmp_path) == 800
