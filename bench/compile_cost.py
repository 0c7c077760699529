"""What ``train.compile`` costs and buys on this machine: the one-off compile time and the per-step speed-up.

The builtin qwen2-tiny (default shape, pretrained for one step: weights do not change the speed) trains one stage
at the harness's default training settings (batch 16, no length grouping, fp32) on a natural mixture of five
recipes, each run in a fresh process, in the order ``--modes`` gives: ``eager``; ``compiled`` (as ``harness run``
compiles: :func:`harness.training.compiling.compiled_stage`, deterministic algorithms on); ``compiled-nondet`` (without
them: what they cost, and the last-bit differences between identical runs they remove). All runs share one fresh
Inductor cache, so the first compiled run of a kind is cold and later ones warm. Reported per run: the median
s/step after ``--settle`` steps, the total, the overhead (the total minus ``steps ×`` its own steady s/step: the
extra time of its first steps), the speed-up over the eager runs' median, the slow steps, and the first logged
losses (equal across the ``compiled`` runs; ``compiled-nondet`` ones differ). These numbers chose
:data:`harness.training.compiling.AUTO_COMPILE_MIN_STEPS`.

    python bench/compile_cost.py --steps 60 --settle 10 \
        --modes compiled,compiled-nondet,eager,compiled,compiled-nondet,eager   # ~15 min on 2 busy CPU cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def experiment(steps: int, compile_mode) -> dict:
    def task(recipe, **params):
        return {"recipe": recipe, "train": 300, "eval": 1, "params": params}

    return {
        "name": "compile_cost",
        "seed": 0,
        "world": {"people": 200, "seed": 0},
        "model": {"builtin": "qwen2-tiny", "pretrain": {"steps": 1}},
        "tasks": {
            "repeat": task("repeat"),
            "yesno": task("yesno"),
            "short_qa": task("short_qa"),
            "assistant_qa": task("assistant_qa"),
            "math": task("math_reversed", digits=3),
        },
        "train": {"compile": compile_mode, "log_every": 10},
        "eval": {"splits": ["heldout"]},
        "stages": [{"name": "s", "steps": steps, "mixture": "natural"}],
        "tracking": {"wandb": {"mode": "disabled"}, "console": False},
    }


def child(steps: int, compile_mode: bool, nondeterministic: bool = False) -> dict:
    """Train the stage in this process; per-step end times and the logged losses. ``nondeterministic``: compile
    without :func:`harness.training.compiling.compiled_stage` (what deterministic algorithms cost)."""
    import contextlib
    import warnings

    warnings.filterwarnings("ignore")
    from harness.config import validate_data
    from harness.data.stage_batches import plan_stage
    from harness.runs.planning.prepare import build_task_data, encode_task_data, load_base, stage_batching
    from harness.training import loop as train_module
    from harness.training.loop import StageLoop, train_stage
    from harness.training.special_tokens import stage_special_tokens

    if nondeterministic:
        train_module.compiled_stage = lambda compiled: contextlib.nullcontext()

    exp = validate_data(experiment(steps, compile_mode))
    data = build_task_data(exp)
    model, tokenizer, _, _ = load_base(exp, data)
    encoded = encode_task_data(exp, data, tokenizer)
    stage = exp.resolved_stages()[0]
    plan = plan_stage(stage_batching(exp), stage, 0, encoded.train, tokenizer.pad_token_id)
    losses, times = [], [time.perf_counter()]
    train_stage(
        model,
        plan.batches,
        StageLoop(
            stage="s",
            start_step=0,
            tasks=list(exp.tasks),
            train=stage.train,
            evaluate=lambda step: None,
            log=lambda rows, step: losses.extend(r.value for r in rows if r.metric == "loss" and r.task is None),
            special_tokens=stage_special_tokens(tokenizer, plan.batches),
            progress=lambda n: times.append(time.perf_counter()),
        ),
    )
    return {"step_s": [b - a for a, b in zip(times, times[1:])], "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--settle", type=int, default=20, help="steps excluded from the steady s/step")
    parser.add_argument(
        "--modes",
        default="eager,compiled,compiled",
        help="runs in order: eager | compiled | compiled-nondet (the same Inductor cache for all: "
        "the first compiled run of a kind is cold, later ones warm)",
    )
    parser.add_argument("--child", choices=["eager", "compiled", "compiled-nondet"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.steps, args.child != "eager", args.child == "compiled-nondet")))
        return
    inductor = tempfile.mkdtemp(prefix="compile-cost-inductor-")
    results = {}
    seen: dict[str, int] = {}
    for mode in args.modes.split(","):
        seen[mode] = seen.get(mode, 0) + 1
        name = mode if mode == "eager" else f"{mode}, {'cold' if seen[mode] == 1 else 'warm'}"
        name += f" #{seen[mode]}" if mode == "eager" and seen[mode] > 1 else ""
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": inductor}
        out = subprocess.run(
            [sys.executable, __file__, "--steps", str(args.steps), "--child", mode],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        results[name if name not in results else f"{name} #{seen[mode]}"] = json.loads(
            out.stdout.strip().splitlines()[-1]
        )
    eager = statistics.median(
        [t for name, r in results.items() if name.startswith("eager") for t in r["step_s"][args.settle :]]
    )
    for name, r in results.items():
        steady = statistics.median(r["step_s"][args.settle :])
        total = sum(r["step_s"])
        print(
            f"{name:26s} steady {steady * 1000:7.1f} ms/step  total {total:6.1f} s  overhead "
            f"{total - steady * len(r['step_s']):5.1f} s  first step {r['step_s'][0]:5.1f} s  "
            f"speed-up {eager / steady:4.2f}x"
        )
        slow = [(i, round(t, 1)) for i, t in enumerate(r["step_s"]) if t > 3 * steady]
        print(f"{'':26s} slow steps (index, s): {slow}; first losses {r['losses'][:3]}")


if __name__ == "__main__":
    main()
