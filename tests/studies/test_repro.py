"""``harness repro``: every reproduction under experiments/repro/ validates and runs at micro size; the interval
helpers; reuse of finished runs; bad input exits 2; the world corpus's augmentation fields."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from data_recipes import build_world, corpus
from harness.config import ConfigError
from harness.core import stats
from harness.runs.planning.prepare import build_task_data
from harness.studies.repro import plan as repro_mod
from harness.studies.repro.plan import arm_experiment, available, load_repro, parse_seeds, run_repro
from harness.studies.repro.report import across_seeds, markdown, paired_difference, paired_items, write_outputs
from tests.conftest import invoke, write_yaml

NAMES = available()


def test_four_reproductions_are_shipped():
    assert set(NAMES) == {"reversed_addition", "seesaw", "dmt", "knowledge_extraction", "steering"}


@pytest.mark.parametrize("name", NAMES)
def test_every_arm_validates_at_default_and_micro_size(name):
    repro = load_repro(name)
    for arm in repro.spec.arms:
        full = arm_experiment(repro, arm, seed=5)
        micro = arm_experiment(repro, arm, seed=5, micro=True)
        assert full.seed == micro.seed == 5
        assert sum(s.steps for s in micro.resolved_stages()) < sum(s.steps for s in full.resolved_stages())
        for m in repro.spec.metrics:
            assert m.task in full.tasks, f"{name}/{arm}: metric task {m.task} not in the experiment"


# DMT's micro run is the longest (~16 s: five arms); the others cover the report in the default suite.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "dmt" else n for n in NAMES])
def test_micro_run_writes_table_figure_and_results(name, tmp_path):
    repro = load_repro(name)
    if repro.spec.expect:
        arms = [repro.spec.expect.higher, repro.spec.expect.lower]  # the two arms the slow test compares
    else:  # no published direction (steering: a comparison): its last two arms (the adaptive ones)
        arms = [a for a in repro.spec.arms if not repro.spec.arm(a).optional][-2:]
    outcomes = run_repro(repro, [0], tmp_path, micro=True, arms=arms, echo=lambda _: None)
    md = write_outputs(repro, outcomes, tmp_path, f"harness repro {name} --micro")
    assert (tmp_path / f"{name}.png").stat().st_size > 0
    result = json.loads((tmp_path / "results.json").read_text())
    assert list(result["arms"]) == arms
    for info in result["arms"].values():
        for m in info["metrics"].values():
            run = m["runs"][0]
            assert run["n"] > 0 and 0.0 <= run["value"] <= 1.0
            assert run["wilson"][0] <= run["value"] <= run["wilson"][1]
            assert m["across"] == "none: one seed" and math.isnan(m["low"]), "one seed: no interval, not [0, 1]"
    assert "| " + arms[0] + " |" in md.read_text()
    assert "(one seed: its Wilson interval; no interval across seeds)" in md.read_text()


def test_finished_runs_are_reused_not_rerun(tmp_path, monkeypatch):
    repro = load_repro("reversed_addition")
    run_repro(repro, [0], tmp_path, micro=True, arms=["reversed"], echo=lambda _: None)

    def fail(*args, **kwargs):
        raise AssertionError("a finished run was run again")

    monkeypatch.setattr("harness.runs.execution.runner.run_experiment", fail)
    lines: list[str] = []
    again = run_repro(repro, [0], tmp_path, micro=True, arms=["reversed"], echo=lines.append)
    assert "reused" in lines[0] and again[0].n["math/heldout/greedy"] == 16


def test_an_unfinished_run_is_restarted_not_refused(tmp_path):
    repro = load_repro("reversed_addition")
    run_dir = tmp_path / "runs" / "reversed" / "seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text('{"run_id": "killed-before-its-summary"}')  # what a killed run leaves
    (run_dir / "metrics.parquet").write_bytes(b"half a file")
    lines: list[str] = []
    outcome = run_repro(repro, [0], tmp_path, micro=True, arms=["reversed"], echo=lines.append)[0]
    assert "unfinished, to restart" in lines[0]
    assert json.loads((run_dir / "run.json").read_text())["run_id"] != "killed-before-its-summary"
    assert (run_dir / "summary.json").is_file() and outcome.n["math/heldout/greedy"] == 16


def test_a_finished_run_of_another_configuration_is_run_again(tmp_path):
    repro = load_repro("reversed_addition")
    run_repro(repro, [0], tmp_path, micro=True, arms=["reversed"], echo=lambda _: None)
    run_dir = tmp_path / "runs" / "reversed" / "seed0"
    first_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    edited = repro_mod.Repro(
        repro.name, repro.directory, repro.spec.model_copy(update={"micro": [*repro.spec.micro, "tasks.math.eval=8"]})
    )
    lines: list[str] = []
    outcome = run_repro(edited, [0], tmp_path, micro=True, arms=["reversed"], echo=lines.append)[0]
    assert "differs in tasks: to run again" in lines[0]
    assert json.loads((run_dir / "run.json").read_text())["run_id"] != first_id
    assert outcome.n["math/heldout/greedy"] == 8


def test_a_run_in_use_by_another_process_is_left_alone(tmp_path):
    from harness.runs.execution.rundir import RunDirError, claim_run_dir

    run_dir = tmp_path / "runs" / "reversed" / "seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text('{"run_id": "still-running"}')
    with claim_run_dir(run_dir, resume=True, force=False):  # the other process holds the lock
        with pytest.raises(RunDirError, match="in use"):
            run_repro(
                load_repro("reversed_addition"), [0], tmp_path, micro=True, arms=["reversed"], echo=lambda _: None
            )
    assert json.loads((run_dir / "run.json").read_text())["run_id"] == "still-running"


def test_jobs_run_in_parallel_processes_with_the_sequential_results(tmp_path, monkeypatch):
    import torch

    # One thread on both sides (float sums in one order) and a stage cache each, so nothing is replayed.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        repro = load_repro("reversed_addition")
        monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache_jobs"))
        side_by_side = run_repro(
            repro, [0, 1], tmp_path / "jobs", micro=True, arms=["reversed"], echo=lambda _: None, jobs=2
        )
        monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache_seq"))
        one_by_one = run_repro(repro, [0, 1], tmp_path / "seq", micro=True, arms=["reversed"], echo=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    assert [(o.seed, o.items) for o in side_by_side] == [(o.seed, o.items) for o in one_by_one]
    ids = {
        json.loads((tmp_path / "jobs" / "runs" / "reversed" / f"seed{s}" / "run.json").read_text())["run_id"]
        for s in (0, 1)
    }
    assert len(ids) == 2


def test_jobs_report_a_failed_run_finish_those_going_and_start_no_more(tmp_path):
    from harness.runs.execution.rundir import RunDirError, claim_run_dir

    locked = tmp_path / "runs" / "reversed" / "seed0"
    locked.mkdir(parents=True)
    (locked / "run.json").write_text('{"run_id": "still-running"}')
    lines: list[str] = []
    with claim_run_dir(locked, resume=True, force=False):  # seed 0's directory is another process's
        with pytest.raises(RunDirError, match="in use"):
            run_repro(
                load_repro("reversed_addition"),
                [0, 1, 2, 3, 4, 5],
                tmp_path,
                micro=True,
                arms=["reversed"],
                echo=lines.append,
                jobs=2,
            )
    assert "reversed seed 0: failed (RunDirError)" in lines
    assert json.loads((locked / "run.json").read_text())["run_id"] == "still-running"
    # seed 1 started beside seed 0 and finished. No run starts once the failure is seen; but a micro run trains in a
    # few seconds, so seed 1 can finish (and seed 2 take its place) before seed 0's process has even imported torch
    # and failed: seeds 2 and even 3 may have started under load (races the clean-clone suite and a loaded machine
    # hit), seed 5 would need seeds 1 to 4 all to finish first
    assert (tmp_path / "runs" / "reversed" / "seed1" / "summary.json").is_file()
    assert not (tmp_path / "runs" / "reversed" / "seed5").exists()


def test_repeated_arm_names_run_once(tmp_path):
    outcomes = run_repro(
        load_repro("reversed_addition"), [0], tmp_path, micro=True, arms=["reversed", "reversed"], echo=lambda _: None
    )
    assert [(o.arm, o.seed) for o in outcomes] == [("reversed", 0)]


def test_scale_multiplies_the_listed_fields():
    repro = load_repro("reversed_addition")
    assert arm_experiment(repro, "reversed", 0, scale=0.5).resolved_stages()[0].steps == 450
    assert arm_experiment(repro, "plain_1600", 0, scale=2).resolved_stages()[0].steps == 3200  # arm set, then scale


def test_optional_arms_run_only_when_named(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(
        "harness.runs.execution.runner.run_experiment", lambda exp, d, **kw: ran.append(exp.name) or 1 / 0
    )
    with pytest.raises(ZeroDivisionError):
        run_repro(load_repro("reversed_addition"), [0], tmp_path, echo=lambda _: None)
    assert ran == ["repro_reversed_addition_reversed"]


def _runs(values, n=64, items=None, data_seeds=(0, 1, 2)):
    return [
        repro_mod.RunOutcome(
            "a", s, {"m": v}, {"m": n}, items={"m": items[i]} if items else {}, data_seed=data_seeds[i]
        )
        for i, (s, v) in enumerate(zip(range(len(values)), values))
    ]


def test_across_seeds_intervals_stay_in_0_1_and_are_never_zero_width():
    # docs/repro/dmt.md printed "0.000 [0.000, 0.000]" for three seeds at 0/64: now the pooled items' Wilson
    agree = across_seeds(_runs([0.0, 0.0, 0.0]), "m")
    assert (agree["low"], agree["high"]) == pytest.approx(stats.wilson_interval(0, 3 * 64)[1:3]) and agree["high"] > 0
    spread = across_seeds(_runs([0.05, 0.5, 0.95], n=16), "m")  # a t-interval printed [-0.57, 1.73] for such seeds
    assert 0.0 <= spread["low"] < spread["mean"] < spread["high"] <= 1.0
    same = [{i: i % 2 == 0 for i in range(10)}] * 3  # same data seed, same outcomes on items that differ
    shared = across_seeds(_runs([0.5] * 3, n=10, items=same, data_seeds=(4, 4, 4)), "m")
    assert shared["method"] == "seeds × items" and shared["high"] - shared["low"] > 0.3
    one = across_seeds(_runs([0.25]), "m")
    assert one["method"] == "none: one seed" and math.isnan(one["low"]) and math.isnan(one["high"])


def test_the_table_says_when_there_is_no_interval_across_seeds():
    result = {
        "title": "t",
        "source": "s",
        "published": "p",
        "arms": {
            "a": {
                "x": None,
                "metrics": {
                    "m": {
                        "mean": 0.25,
                        "low": math.nan,
                        "high": math.nan,
                        "across": "none: one seed",
                        "runs": [{"seed": 0, "value": 0.25, "n": 16, "wilson": [0.1, 0.5]}],
                    }
                },
            }
        },
    }
    text = markdown(result, "cmd", None)
    assert "0.250 (one seed: its Wilson interval; no interval across seeds)" in text and "[0.000, 1.000]" not in text


def test_paired_difference_has_the_sign_and_seeds_of_the_data():
    outcomes = [
        repro_mod.RunOutcome(arm, seed, {"m": value})
        for arm, seed, value in [
            ("a", 0, 0.9),
            ("b", 0, 0.1),
            ("a", 1, 0.8),
            ("b", 1, 0.2),
            ("a", 2, 0.95),
            ("b", 2, 0.0),
            ("a", 3, 0.5),
        ]
    ]
    d = paired_difference(outcomes, "a", "b", "m")
    assert d["seeds"] == [0, 1, 2] and d["mean"] == pytest.approx(0.7833, abs=1e-3)
    assert d["low"] > 0 and d["p_paired_t"] < 0.05
    assert paired_difference(outcomes, "b", "a", "m")["high"] < 0


def test_bad_input_is_one_error_with_exit_2(tmp_path):
    # In process (typer's runner): each is refused before any work; an escaping exception would be exit code 1.
    result = invoke("repro", "no_such_repro")
    assert result.exit_code == 2 and "known: " in result.stderr and "Traceback" not in result.stderr
    assert invoke("repro", "reversed_addition", "--seeds", "0,x").exit_code == 2
    assert invoke("repro", "reversed_addition", "--arms", "nope", "--micro", "--out", str(tmp_path)).exit_code == 2
    with pytest.raises(ValueError):
        parse_seeds("1,1")
    bad = tmp_path / "bad"
    bad.mkdir()
    write_yaml(
        bad / "repro.yaml",
        {
            "title": "t",
            "source": "s",
            "published": "p",
            "metrics": [{"task": "math"}],
            "arms": {"a": "missing.yaml"},
            "expect": {"higher": "a", "lower": "zz"},
        },
    )
    with pytest.raises(ConfigError) as e:
        load_repro(bad)
    assert "arms.a.file" in str(e.value) and "expect.lower" in str(e.value)


def test_list_names_every_reproduction():
    result = invoke("repro", "--list")
    assert result.exit_code == 0 and all(name in result.stdout for name in NAMES)


def test_world_corpus_augmentation_fields():
    world = build_world(12, 0)
    default = corpus(world, 0)
    assert default == corpus(world, 0, docs_per_person=4, permute=True)  # defaults unchanged
    single = corpus(world, 0, docs_per_person=1, permute=False, filler_docs=0)
    assert len(single) == 12 and len(corpus(world, 0, docs_per_person=3, filler_docs=0)) == 36

    def job_before_home(docs):
        return [doc.index(p.job) < doc.rindex(p.home_city) for p in world.people for doc in docs if p.name in doc]

    fixed = job_before_home(corpus(world, 0, docs_per_person=3, permute=False, filler_docs=0))
    shuffled = job_before_home(corpus(world, 0, docs_per_person=3, permute=True, filler_docs=0))
    assert fixed and all(fixed)
    assert not all(shuffled)


def test_paired_items_counts_discordant_items_per_seed():
    a = repro_mod.RunOutcome("a", 0, {"m": 0.6}, items={"m": {i: i < 30 for i in range(50)}})
    b = repro_mod.RunOutcome("b", 0, {"m": 0.2}, items={"m": {i: 20 <= i < 30 or i == 49 for i in range(50)}})
    (row,) = paired_items([a, b], "a", "b", "m")
    assert (row["n"], row["only_higher"], row["only_lower"]) == (50, 20, 1)
    assert row["p_mcnemar_exact"] < 1e-4
    assert paired_items([a, b], "b", "a", "m")[0]["only_higher"] == 1


def test_reversed_and_plain_arms_share_their_operand_pairs():
    """The item-level paired test between the formats needs the same held-out pairs at the same indices."""
    repro = load_repro("reversed_addition")
    splits = [
        build_task_data(arm_experiment(repro, arm, 0, micro=True)).splits["math"] for arm in ("reversed", "plain")
    ]
    for split in ("heldout", "train"):
        pairs = [[(e.meta["a"], e.meta["b"]) for e in s[split]] for s in splits]
        assert pairs[0] == pairs[1]
    assert splits[0]["heldout"][0].answer != splits[1]["heldout"][0].answer  # the formats do differ


def _stat_fields(stat: Path) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, parent pid, …); [] once the process is gone."""
    try:
        return stat.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _worker_pids(parent: int) -> set[int]:
    """Live processes whose parent is ``parent`` and that run a multiprocessing spawn (``/proc``, Linux)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat_fields(stat)
        try:
            spawned = b"spawn_main" in (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        if len(fields) > 1 and fields[1] == str(parent) and spawned:
            found.add(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped, is not)."""
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    return bool(fields) and fields[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads /proc")
def test_sigterm_to_a_parallel_repro_ends_its_workers(tmp_path):
    """``kill`` of ``harness repro --jobs 2`` ends the runs it started (they once ran on alone and wrote results)."""
    import contextlib
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "harness",
        "repro",
        "reversed_addition",
        "--jobs",
        "2",
        "--seeds",
        "0,1",
        "--arms",
        "reversed",
        "--out",
        str(out),
    ]  # full size: minutes per run, so nothing ends by itself
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:  # a file, not a pipe: the workers inherit it and nobody drains a pipe here
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, "HARNESS_CACHE": str(tmp_path / "cache")},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while len(_worker_pids(proc.pid)) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        workers = _worker_pids(proc.pid)
        assert len(workers) == 2, f"workers {workers}; {log.read_text()[-2000:]}"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in workers if _alive(pid)], "a worker outlived the repro"
    finally:  # never leave minutes-long training behind, whatever failed
        for pid in workers | _worker_pids(proc.pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert not list(out.glob("runs/reversed/seed*/summary.json"))
