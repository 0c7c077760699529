"""The quickstart's claims hold over seeds and kernel paths (issues 14, 31, 41; judged distributionally since issue
53): ``experiments/quickstart.yaml`` exactly as shipped, run as a seed group (``--seeds 0,1,2,3,4``: the same task
data, five trainings, each pretraining its own base) on two kernel paths of this machine (``native`` and ``avx2``,
set by ``bench/kernel_path.sh``), and each claim of :data:`bench.quickstart_claims.CRITERION` — every task above its
baseline, yes/no's ranking, the first-token hijack, a seesaw event, the forgetting — must hold in at least 4 of the
5 seeds **on each path** (:data:`bench.quickstart_claims.HOLDS_IN`).

A claim that one seed on one kernel path passes is a claim about that path: the tiny model trained from scratch
turns a last-bit difference between AVX2 and AVX-512 kernels into a different run (docs/kernel_paths.md). The
claims and their judges live in ``bench/quickstart_claims.py``, which also prints the table of docs/quickstart.md.
Ten quickstart runs: about 1.5 hours on 2 CPU cores at one thread per path (docs/quickstart.md); a miss is a finding
about the default, to report, not a threshold to loosen."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests.conftest import ROOT

SEEDS = "0,1,2,3,4"
PATHS = ["native", "avx2"]


def _claims_module():
    spec = importlib.util.spec_from_file_location("quickstart_claims", ROOT / "bench" / "quickstart_claims.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_claims = _claims_module()
HIJACK_LOW = _claims.HIJACK_LOW


def criterion_misses(summary: dict) -> list[str]:
    """One line per miss of the per-replicate criterion (every greedy task above its baseline, yes/no's ranking)."""
    misses = [_claims.greedy_miss(summary, task) for task in _claims.GREEDY_TASKS] + [_claims.choice_miss(summary)]
    return [m for m in misses if m is not None]


def shown_misses(summary: dict, run_dir) -> list[str]:
    """What one replicate failed to show of the hijack and a seesaw event (any family)."""
    return [m for m in (_claims.hijack_miss(run_dir), _claims.event_miss(summary)) if m is not None]


@pytest.mark.slow
def test_quickstart_claims_hold_over_seeds_and_kernel_paths(tmp_path, monkeypatch):
    claims = _claims
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    groups = claims.run_groups(SEEDS, tmp_path, PATHS)  # a cold stage cache of its own per path
    judged = claims.judge_groups(groups)
    print(claims.claims_table(judged))
    stated = claims.stated_claims(judged)
    misses = [
        f"{path} seed {seed}: {miss}"
        for path, runs in judged.items()
        for seed, found in runs.items()
        for name, miss in found.items()
        if miss and name in claims.CRITERION
    ]
    assert all(stated[name] for name in claims.CRITERION), "; ".join(misses)


def test_the_claims_judge_counts_a_claim_stated_only_where_it_holds_in_4_of_5_seeds_on_every_path():
    claims = _claims
    name = next(iter(claims.CLAIMS))
    holds = {s: {n: None for n in claims.CLAIMS} for s in range(5)}
    one_miss = {s: {n: ("miss" if s == 0 and n == name else None) for n in claims.CLAIMS} for s in range(5)}
    two_misses = {s: {n: ("miss" if s < 2 and n == name else None) for n in claims.CLAIMS} for s in range(5)}
    assert claims.stated_claims({"a": holds, "b": one_miss})[name]
    assert not claims.stated_claims({"a": holds, "b": two_misses})[name]
    table = claims.claims_table({"a": holds, "b": two_misses})
    assert f"| {name} | 5/5 | 3/5 | 8/10 = 0.80 [0.49, 0.94] | no |" in table
