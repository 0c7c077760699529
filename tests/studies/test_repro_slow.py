"""The published direction of each reproduction at its default size, 3 seeds (``make test-all``; hours on 2 CPU
cores, see docs/repro/). Each asserts the paired difference (the publication's better arm minus its worse arm on
the headline metric, paired by seed) has a 95 % t-interval above 0. A null here is a finding to report in
docs/repro/NAME.md, not a threshold to tune."""

from __future__ import annotations

import pytest

from harness.studies.repro.plan import available, load_repro, run_repro
from harness.studies.repro.report import paired_difference, write_outputs


@pytest.mark.slow
@pytest.mark.parametrize("name", available())
def test_published_direction_at_default_size(name, tmp_path):
    repro = load_repro(name)
    expect = repro.spec.expect
    if expect is None:
        pytest.skip(f"{name} states no published direction (bench/steering_compare.py runs the comparison)")
    outcomes = run_repro(repro, [0, 1, 2], tmp_path, arms=[expect.higher, expect.lower])
    write_outputs(repro, outcomes, tmp_path, f"harness repro {name}")
    d = paired_difference(outcomes, expect.higher, expect.lower, repro.spec.metrics[0].label)
    assert d["seeds"] == [0, 1, 2]
    assert d["low"] > 0, f"{name}: {expect.higher} − {expect.lower} = {d['mean']:.3f} [{d['low']:.3f}, {d['high']:.3f}]"
