"""The quickstart's claims judged over seeds and kernel paths (issue 53): each claim's share of (seed, kernel path)
runs in which it holds, with its Wilson interval, and each task's final score per path with the interval across
seeds and items.

A claim that one seed on one kernel path passes is a claim about that path: the tiny model trained from scratch
turns a last-bit difference between kernel paths (AVX2 against AVX-512 in torch's own kernels and in the BLAS) into
a different run. So the quickstart is run as a seed group on each path this machine can take
(``bench/kernel_path.sh`` sets them) and every claim is counted over all of them.

    python bench/quickstart_claims.py --run --seeds 0,1,2,3,4 --out runs/claims      # trains, then judges
    python bench/quickstart_claims.py --group avx512=runs/claims/avx512 --group avx2=runs/claims/avx2

The claims (what the README says of the quickstart; the criterion of ``tests/repo/test_quickstart_slow.py``):

- ``<task> above baseline``: at the last evaluation the Wilson 95 % interval of greedy accuracy lies wholly above
  the pool's constant-answer baseline (math and repeat on ``heldout``, short_qa and assistant_qa on
  ``heldout_template``);
- ``yes/no ranking``: yes/no's ``choice_auc`` on ``heldout_template`` has its 95 % score interval wholly above 0.5;
- ``hijack``: at some evaluation the share of open questions (short_qa, assistant_qa; ``heldout_template``) whose
  most likely first answer token is yes/no has a Wilson lower bound of at least 0.1;
- ``seesaw event``: the run's paired test (BH over the run's tests) finds at least one event, of any family;
- ``task-task seesaw event``: at least one event between two tasks (not the reference text);
- ``forgetting``: the last evaluation's paired interval of the reference-text loss minus the base's lies wholly
  above 0.

A claim is *stated* where it holds in at least :data:`HOLDS_IN` of every path's seeds (4 of 5).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KERNEL_PATHS = ("native", "avx512", "avx2", "default")  # bench/kernel_path.sh's names
SPLIT = {
    "repeat": "heldout",
    "math": "heldout",
    "short_qa": "heldout_template",
    "assistant_qa": "heldout_template",
    "yesno": "heldout_template",
}
GREEDY_TASKS = ("math", "repeat", "short_qa", "assistant_qa")
CHOICE_TASK = "yesno"
HIJACKED = ("short_qa", "assistant_qa")
HIJACK_LOW = 0.1
#: A claim is stated when it holds in at least this share of each path's seeds (4 of 5, issue 53).
HOLDS_IN = 0.8


def _baseline(summary: dict, split: str, task: str) -> float:
    """The pool's greedy baseline: its constant answer's accuracy (for yes/no also chance, 0.5; the larger)."""
    return max(b["value"] for b in summary["baselines"][split][task] if b["metric"] == "greedy")


def greedy_miss(summary: dict, task: str) -> str | None:
    split = SPLIT[task]
    final = summary["stages"][-1]
    ci = final["intervals"][split][task]["greedy"]
    greedy = final["metrics"][split][task]["greedy"]
    base = _baseline(summary, split, task)
    if ci["ci_low"] > base:
        return None
    return (
        f"{task} {split}: greedy {greedy:.3f} [{ci['ci_low']:.3f}, {ci['ci_high']:.3f}] (n = {ci['n']}) vs {base:.3f}"
    )


def choice_miss(summary: dict, task: str = CHOICE_TASK) -> str | None:
    split = SPLIT[task]
    final = summary["stages"][-1]
    values = final["metrics"][split][task]
    if "choice_auc" not in values:
        return f"{task} {split}: no choice_auc logged (is the first_token probe on?)"
    ci = final["intervals"][split][task]["choice_auc"]
    if ci["ci_low"] > 0.5:
        return None
    return (
        f"{task} {split}: choice_auc {values['choice_auc']:.3f} [{ci['ci_low']:.3f}, {ci['ci_high']:.3f}] "
        f"(n = {ci['n']}, p = {values['choice_auc_p']:.2g}) not above 0.5"
    )


def hijack_miss(run_dir: Path) -> str | None:
    from harness.core.store import read_metrics

    frame = read_metrics(run_dir)
    rows = frame.filter(
        (frame["metric"] == "ft_hijack") & (frame["split"] == "heldout_template") & frame["task"].is_in(HIJACKED)
    )
    lows = rows["ci_low"].drop_nulls().to_list()
    if lows and max(lows) >= HIJACK_LOW:
        return None
    return f"no first-token hijack: largest lower bound {max(lows, default=0):.3f} < {HIJACK_LOW}"


def event_miss(summary: dict, task_pairs_only: bool = False) -> str | None:
    events = summary.get("seesaw_events") or []
    if task_pairs_only:
        events = [e for e in events if not any(str(e.get(k, "")).startswith("ref:") for k in ("rose", "fell"))]
    return None if events else ("no task-task seesaw event" if task_pairs_only else "no seesaw event")


def forgetting_miss(run_dir: Path) -> str | None:
    from harness.core.store import read_metrics

    frame = read_metrics(run_dir)
    rows = frame.filter(frame["metric"] == "ref_loss_delta").sort("step")
    if rows.is_empty():
        return "no forgetting probe rows"
    last = rows.row(-1, named=True)
    if last["ci_low"] is not None and last["ci_low"] > 0:
        return None
    return f"reference loss - base {last['value']:.3f} [{last['ci_low']}, {last['ci_high']}] not above 0"


#: claim name -> judge(summary, run_dir) returning None when the claim holds, else one line saying why not.
CLAIMS: dict[str, Callable[[dict, Path], str | None]] = {
    **{f"{task} above baseline": (lambda s, d, t=task: greedy_miss(s, t)) for task in GREEDY_TASKS},
    "yes/no ranking (choice_auc > 0.5)": lambda s, d: choice_miss(s),
    "hijack (lower bound >= 0.1 at some evaluation)": lambda s, d: hijack_miss(d),
    "seesaw event (any family)": lambda s, d: event_miss(s),
    "task-task seesaw event": lambda s, d: event_miss(s, task_pairs_only=True),
    "forgetting (reference loss above base)": lambda s, d: forgetting_miss(d),
}
#: The claims the quickstart slow test asserts (the criterion); the others are reported.
CRITERION = tuple(name for name in CLAIMS if name != "task-task seesaw event")


def judge_run(run_dir: Path) -> dict[str, str | None]:
    """Each claim's miss (None where it holds) in one replicate."""
    summary = json.loads((run_dir / "summary.json").read_text())
    return {name: judge(summary, run_dir) for name, judge in CLAIMS.items()}


def judge_groups(groups: dict[str, Path]) -> dict[str, dict[int, dict[str, str | None]]]:
    """``{path: {seed: {claim: miss}}}`` over each path's seed group."""
    from analysis.group import replicate_runs

    return {path: {s: judge_run(d) for s, d in replicate_runs(g).items()} for path, g in groups.items()}


def stated_claims(judged: dict[str, dict[int, dict[str, str | None]]]) -> dict[str, bool]:
    """Per claim: whether it holds in at least :data:`HOLDS_IN` of the seeds on every path."""
    out = {}
    for name in CLAIMS:
        shares = [sum(r[name] is None for r in runs.values()) / len(runs) for runs in judged.values() if runs]
        out[name] = bool(shares) and min(shares) >= HOLDS_IN
    return out


def claims_table(judged: dict[str, dict[int, dict[str, str | None]]]) -> str:
    """Markdown: claim | per path k/n | all runs k/n with Wilson 95 % | stated."""
    from harness.core.stats import wilson_interval

    paths = list(judged)
    stated = stated_claims(judged)
    lines = [
        "| claim | "
        + " | ".join(f"{p}: holds in" for p in paths)
        + " | all (seed, path) runs [95 % Wilson] | stated |",
        "|---|" + "---|" * len(paths) + "---|---|",
    ]
    for name in CLAIMS:
        cells, k_all, n_all = [], 0, 0
        for p in paths:
            k = sum(r[name] is None for r in judged[p].values())
            n = len(judged[p])
            cells.append(f"{k}/{n}")
            k_all, n_all = k_all + k, n_all + n
        ci = wilson_interval(k_all, n_all)
        share = f"{k_all}/{n_all} = {k_all / n_all:.2f} [{ci.low:.2f}, {ci.high:.2f}]" if n_all else "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {share} | {'yes' if stated[name] else 'no'} |")
    return "\n".join(lines)


def scores_table(groups: dict[str, Path]) -> str:
    """Markdown: each judged task's final score per path, mean over seeds with the interval across seeds × items."""
    from analysis.group import choice_scores, final_scores

    lines = ["| task (split, metric) | " + " | ".join(groups) + " |", "|---|" + "---|" * len(groups)]
    cells: dict[str, list[str]] = {}
    for group in groups.values():
        greedy = final_scores(group, "greedy")
        for task in GREEDY_TASKS:
            row = greedy.filter((greedy["task"] == task) & (greedy["split"] == SPLIT[task])).row(0, named=True)
            cells.setdefault(f"{task} ({SPLIT[task]}, greedy; baseline {row['baseline']:.3f})", []).append(
                f"{row['mean']:.3f} [{row['across_low']:.3f}, {row['across_high']:.3f}] ({row['values']})"
            )
        choice = choice_scores(group)
        row = choice.filter((choice["task"] == CHOICE_TASK) & (choice["split"] == SPLIT[CHOICE_TASK])).row(
            0, named=True
        )
        cells.setdefault("yesno (heldout_template, choice_auc; chance 0.5)", []).append(
            f"{row['mean']:.3f} [{row['t_low']:.3f}, {row['t_high']:.3f}]"
        )
    lines += [f"| {name} | " + " | ".join(values) + " |" for name, values in cells.items()]
    return "\n".join(lines)


def run_groups(seeds: str, out: Path, paths: list[str]) -> dict[str, Path]:
    """Train the quickstart as a seed group on each kernel path (a stage cache of its own per path)."""
    groups = {}
    for path in paths:
        group = out / path
        env = {**os.environ, "HARNESS_CACHE": str(out / f"cache-{path}")}
        command = ["bench/kernel_path.sh", path, "--", "harness", "run", "experiments/quickstart.yaml"]
        command += ["--seeds", seeds, "--out", str(group)]
        subprocess.run(command, cwd=ROOT, env=env, check=True)
        groups[path] = group
    return groups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", action="append", default=[], help="PATH=GROUP_DIR of a finished seed group")
    parser.add_argument("--run", action="store_true", help="train the seed groups first (--seeds, --out, --paths)")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "claims")
    parser.add_argument("--paths", default="native,avx2", help=f"kernel paths, of {KERNEL_PATHS}")
    args = parser.parse_args(argv)
    groups = {k: Path(v) for k, v in (g.split("=", 1) for g in args.group)}
    if args.run:
        groups.update(run_groups(args.seeds, args.out, args.paths.split(",")))
    judged = judge_groups(groups)
    print(claims_table(judged), "\n")
    print(scores_table(groups), "\n")
    for path, runs in judged.items():
        for seed, misses in runs.items():
            for name, miss in misses.items():
                if miss:
                    print(f"{path} seed {seed}: {name}: {miss}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
