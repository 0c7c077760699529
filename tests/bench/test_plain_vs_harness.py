"""bench/plain_vs_harness.py at micro size: both arms train on the same items and report held-out exact match
with a Wilson interval at each requested step (the full-size table is in the closing note of the training issue)."""

from __future__ import annotations

import importlib.util
import math
import sys

from tests.conftest import ROOT


def _bench():
    spec = importlib.util.spec_from_file_location("plain_vs_harness", ROOT / "bench" / "plain_vs_harness.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_wilson_interval():
    bench = _bench()
    lo, hi = bench.wilson(411, 500)
    assert math.isclose(lo, 0.786, abs_tol=1e-3) and math.isclose(hi, 0.853, abs_tol=1e-3)
    assert bench.wilson(0, 40)[0] == 0.0


def test_micro_runs_both_arms_with_flips(tmp_path):
    bench = _bench()
    arms = ("plain", "harness", "plain+grouped", "harness+grouped", "harness+perex")  # perex: loss.reduction
    results = bench.main(["--micro", "--arms", ",".join(arms), "--json", str(tmp_path / "out.json")])
    assert [(r["arm"], r["step"]) for r in results] == [(arm, step) for arm in arms for step in (15, 30)]
    for r in results:
        assert r["n"] == 40 and 0 <= r["lo"] <= r["acc"] <= r["hi"] <= 1
    assert (tmp_path / "out.json").exists()
