"""Analysis of run and sweep directories with polars: load stores, tabulate stage ends, find seesaw events, follow
the first-token hijack, fit mixture interference over sweeps, plot, and write reports.

```python
import analysis as A
runs = A.load_runs("runs/micro/*")                    # one long frame + flattened config columns
A.stage_table(runs, "greedy", split="heldout")        # (run, stage) × task at each stage end
A.seesaw_events(runs)                                  # each run's stored events (paired test, p_value)
A.baselines(runs)                                      # baseline_<metric> of every task × split pool
A.binary_choice_auc(A.load_samples(run), "yesno")      # yes/no ranked right though greedy sits at chance?
trials = A.load_sweep("runs/sweeps/yesno_vs_qa")
fit = A.interference(trials, "greedy")                 # task × task matrix, R², predicted best mixture
A.write_report("runs/micro/20261130-101500")           # report.html + PNGs
```
"""

from __future__ import annotations

from analysis.choice import binary_choice_auc
from analysis.evidence import above_baseline, baselines
from analysis.frames import (
    compare,
    eval_rows,
    format_compare,
    hijack_tasks,
    hijack_timeline,
    lower_is_better,
    readable_prompt,
    seesaw_events,
    stage_bounds,
    stage_table,
    top1_table,
    worst_failures,
)
from analysis.loading import (
    AnalysisError,
    flatten_config,
    latest_run,
    latest_sweep,
    load_run,
    load_runs,
    load_samples,
    load_sweep,
    read_config,
    read_summary,
    read_sweep_config,
    run_dirs,
)
from analysis.sweep import (
    Interference,
    best_trial_dir,
    best_trials,
    fit_objective,
    interference,
    metric_columns,
    objective_columns,
    objective_directions,
    pareto,
    partial_dependence,
    simplex_groups,
    sweep_objective,
    tradeoff_pair,
)


def write_report(path, out=None, **options):
    """``report.html`` (and its PNGs) for a run or sweep directory; see :mod:`analysis.report`."""
    # Imported here, not at the top: the report draws with matplotlib, which `import analysis` does not load.
    from analysis.report import write_report as _write

    return _write(path, out, **options)


__all__ = [
    "AnalysisError",
    "Interference",
    "above_baseline",
    "baselines",
    "binary_choice_auc",
    "best_trial_dir",
    "best_trials",
    "fit_objective",
    "compare",
    "eval_rows",
    "flatten_config",
    "format_compare",
    "hijack_tasks",
    "hijack_timeline",
    "interference",
    "latest_run",
    "latest_sweep",
    "load_run",
    "load_runs",
    "load_samples",
    "load_sweep",
    "lower_is_better",
    "metric_columns",
    "objective_columns",
    "objective_directions",
    "pareto",
    "partial_dependence",
    "read_config",
    "read_summary",
    "read_sweep_config",
    "readable_prompt",
    "run_dirs",
    "seesaw_events",
    "simplex_groups",
    "stage_bounds",
    "stage_table",
    "sweep_objective",
    "tradeoff_pair",
    "top1_table",
    "worst_failures",
    "write_report",
]
