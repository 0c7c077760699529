"""Training speed, side by side: the harness's own training loop against TRL's SFTTrainer.

One tiny model (the builtin qwen2-tiny with the harness's tokenizer, ~1.25M parameters) and one dataset built here
(4,000 chat examples of 15-81 tokens from eight recipes, rendered with the harness's chat template, completion-only
labels), trained for ``--steps`` optimiser steps of ``--batch-size`` examples, fp32, AdamW with the same lr / betas
/ eps / weight decay, constant schedule, no warmup, gradient clipping at 1.0, the same initial weights and the same
examples, by:

- ``harness``: the code path ``harness run`` takes at its defaults —
  :func:`harness.data.stage_batches.plan_stage` (mixture stream, collation),
  :func:`harness.runs.execution.packing_decision.stage_batches` (``train.packing: auto``: the exactness check, then
  packed batches) and :func:`harness.training.loop.train_stage` (the loop, with its default non-finite guard and
  health metrics), logging into a :class:`harness.runs.execution.tracking.Tracker` (wandb disabled, as TRL reports
  to nothing);
- ``harness-nopacking``: the same with ``train.packing: false`` (the defaults before packing); ``harness-grouped``:
  no packing, length grouping on (window 50, stratified by task: the bench's configuration before packing);
- ``harness-noguard`` / ``harness-nodiag`` / ``harness-bare``: the same with ``train.nonfinite: off``,
  ``train.diagnostics: false``, or both — what the guard and the health metrics cost;
- ``trl-default``: TRL's ``SFTTrainer`` with its defaults (gradient checkpointing on, random batches padded to
  their longest example); ``trl-padding-free``: ``padding_free=True``; ``trl-group-by-length``:
  ``train_sampling_strategy="group_by_length"``; ``trl-group-by-length-nockpt``: that, with gradient
  checkpointing off (TRL tuned as far as its documented options go on a CPU); ``trl-bfd`` / ``trl-bfd-nockpt``:
  ``packing=True`` with its best-fit-decreasing strategy (padding-free rows, restarting position ids), one row per
  step of the harness's mean tokens per step.

Every configuration runs in a fresh process, interleaved (A B C … A B C …), and the table reports medians of real
(non-pad) tokens/s, supervised tokens/s, pad fraction, s/step and peak RSS, timed from the end of step
``--warmup`` to the end of the last step, and the ratios harness / TRL configuration. Before timing, the losses of
the two sides are compared over the first ``--check-steps`` steps on the very same batches (TRL fed the harness's
batch order with a sequential sampler), so the comparison is of equal work. The bench also measures this machine's
fp32 matmul throughput on the model's own matmul shapes and reports the harness's training FLOP/s as a fraction
of it.

Run from the repository root (TRL is a benchmark-only dependency: ``pip install -e '.[bench]'``)::

    python bench/train_speed.py                       # the table (about 15 minutes on 2 CPU cores)
    python bench/train_speed.py --reps 1 --steps 60   # a quick look
    python bench/train_speed.py --device cuda --model qwen2.5-0.5b-shape   # bf16 autocast, MFU (GPU only)
    python bench/train_speed.py --configs harness,harness-compile --hidden 512   # a wider qwen2-tiny

``--baseline DIR`` runs every harness configuration chosen a second time from another checkout of the repository
(``git archive HEAD | tar -x -C DIR``, or a worktree), named ``base:<config>`` and interleaved with the rest: before
and after a change, side by side in one bench run on the same inputs.

The machine should be otherwise idle: before each run the bench samples the CPU use of other processes for a
moment and waits (up to ``--max-wait`` seconds) while it is above ``--max-busy``; each run's figure is printed.

This file holds the configurations, the children (each run is this file re-invoked with ``--child NAME``) and the
parent's steps; beside it, ``train_speed_inputs.py`` prepares and loads the shared inputs, ``train_speed_loops.py``
holds the two training loops (harness and TRL), and ``train_speed_limits.py`` the FLOP count, the matmul rate and
the profile's grouping of operators.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The bench's pieces, in modules beside this file. Imported as ``bench.…`` from the repository root just put on
# sys.path, not by bare name (which works only while this file runs as a script, its folder then being sys.path[0]),
# so that they load the same way when a test imports this file by its path.
from bench.train_speed_inputs import load_inputs, prepare, quiet  # noqa: E402
from bench.train_speed_limits import harness_flops, matmul_throughput, profile_kinds  # noqa: E402
from bench.train_speed_loops import harness_train, plan_examples, trl_dataset, trl_train  # noqa: E402

HARNESS_CONFIGS = {
    "harness": {},  # the defaults: packing auto (packs once proven exact), no length grouping
    "harness-nopacking": {"packing": False},  # the defaults before train.packing
    "harness-grouped": {"packing": False, "length_grouping": 50},  # length grouping instead (the bench until then)
    # packed rows attended through transformers' block-diagonal mask (the layout before example-by-example
    # attention, harness.models.packed_attention), rows of 4x the longest example
    # (harness.data.packed_batches.ROW_WIDTH_FACTOR, the fallback) or another width (None: one row per step)
    "harness-masked": {"row_factor": 4},
    "harness-rows1x": {"row_factor": 1},
    "harness-rows2x": {"row_factor": 2},
    "harness-rows8x": {"row_factor": 8},
    "harness-onerow": {"row_factor": None},
    "harness-noguard": {"nonfinite": "off"},
    "harness-nodiag": {"diagnostics": False},
    "harness-bare": {"nonfinite": "off", "diagnostics": False},
    "harness-compile": {"compile": True},
}
TRL_CONFIGS = {
    "trl-default": {},
    "trl-padding-free": {"padding_free": True},
    "trl-group-by-length": {"sampling": "group_by_length"},
    "trl-group-by-length-nockpt": {"sampling": "group_by_length", "gradient_checkpointing": False},
    # best-fit-decreasing packing (TRL's default strategy; padding-free with restarting position ids): one row of
    # the harness's mean tokens per step each step
    "trl-bfd": {"packing": True, "packing_strategy": "bfd"},
    "trl-bfd-nockpt": {"packing": True, "packing_strategy": "bfd", "gradient_checkpointing": False},
}
DEFAULT_CONFIGS = [
    "harness",
    "harness-masked",
    "harness-nopacking",
    "harness-grouped",
    "trl-default",
    "trl-padding-free",
    "trl-bfd",
    "trl-group-by-length",
    "trl-group-by-length-nockpt",
    "trl-bfd-nockpt",
    "harness-compile",
    "harness-noguard",
    "harness-nodiag",
    "harness-bare",
]


# ----------------------------------------------------------------------------------------------------------------
# Children
# ----------------------------------------------------------------------------------------------------------------


def child(args) -> None:
    import torch

    quiet()
    if args.threads:
        torch.set_num_threads(args.threads)
    workdir = Path(args.workdir)
    name = args.child
    if name == "matmul":
        print("RESULT " + json.dumps(matmul_throughput(workdir, args)))
        return
    if name == "check":
        print("RESULT " + json.dumps(loss_check(workdir, args)))
        return
    if name == "profile":
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
        with profile(activities=activities) as prof:
            harness_train(workdir, args.device, {})
        events = prof.key_averages()
        print(
            events.table(
                sort_by="self_cuda_time_total" if args.device == "cuda" else "self_cpu_time_total", row_limit=30
            )
        )
        print(f"self CPU time by kind, ms per step ({args.steps} steps):")
        for kind, share in profile_kinds(events, args.steps).items():
            print(f"  {kind:<34}{share:>8.2f}")
        return
    started = time.perf_counter()
    if name in HARNESS_CONFIGS:
        times, counts, _, model = harness_train(workdir, args.device, HARNESS_CONFIGS[name])
    else:
        times, counts, _, model = trl_train(workdir, args.device, TRL_CONFIGS[name], args.steps)
    w = args.warmup
    window = counts[w : len(times)]
    seconds = times[-1] - times[w - 1]
    real, padded, supervised = (sum(c[i] for c in window) for i in range(3))
    print(
        "RESULT "
        + json.dumps(
            {
                "config": name,
                "steps": len(times) - w,
                "seconds": seconds,
                "real_tokens": real,
                "padded_tokens": padded,
                "supervised_tokens": supervised,
                "real_tps": real / seconds,
                "supervised_tps": supervised / seconds,
                "pad_fraction": 1 - real / padded,
                "s_per_step": seconds / (len(times) - w),
                "setup_s": times[w - 1] - started,  # loading, (compiling) and the untimed first steps
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20 if args.device == "cuda" else 0.0,
                "threads": torch.get_num_threads(),
            }
        )
    )


def loss_check(workdir: Path, args) -> dict:
    """Losses of the first steps on the very same batches: the harness's plan, and TRL fed that plan's examples in
    the same order (sequential sampler), from the same initial weights."""
    from transformers import AutoTokenizer

    exp, pools = load_inputs(workdir)
    tokenizer = AutoTokenizer.from_pretrained(workdir / "tokenizer")
    k = args.check_steps
    _, _, rows, _ = harness_train(workdir, args.device, {}, steps=k, log_every=1)
    ours = [r.value for r in rows if r.metric == "loss" and r.task is None]
    order = plan_examples(exp, exp.resolved_stages()[0], pools, tokenizer.pad_token_id)[: k * exp.train.batch_size]
    out = {"harness": ours}
    for name, settings in (("trl-default", {}), ("trl-padding-free", {"padding_free": True})):
        _, _, losses, _ = trl_train(
            workdir,
            args.device,
            {**settings, "sampling": "sequential"},
            k,
            dataset=trl_dataset(exp, pools, order),
            record_losses=True,
        )
        out[name] = losses
    return out


# ----------------------------------------------------------------------------------------------------------------
# The parent: prepare, check, run interleaved, report
# ----------------------------------------------------------------------------------------------------------------


def cpu_busy(seconds: float = 1.5) -> float:
    """Share of the machine's CPU time used by other processes over ``seconds`` (this one sleeps meanwhile)."""

    def read():
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        idle = values[3] + values[4]
        return sum(values) - idle, sum(values)

    try:
        busy0, total0 = read()
        time.sleep(seconds)
        busy1, total1 = read()
        return (busy1 - busy0) / max(1, total1 - total0)
    except OSError:
        return float("nan")


def wait_until_quiet(args) -> float:
    busy = cpu_busy()
    deadline = time.time() + args.max_wait
    while busy > args.max_busy and time.time() < deadline:
        time.sleep(5)
        busy = cpu_busy()
    return busy


BASE = "base:"  # a configuration run from the --baseline checkout


def spawn(name: str, workdir: Path, args, extra: list[str] = ()) -> dict:
    root, child_name = ROOT, name
    if name.startswith(BASE):  # the same configuration, from the baseline checkout's bench and code
        root, child_name = Path(args.baseline).resolve(), name[len(BASE) :]
    cmd = [
        sys.executable,
        str(root / "bench" / "train_speed.py"),
        "--child",
        child_name,
        "--workdir",
        str(workdir),
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--device",
        args.device,
        "--check-steps",
        str(args.check_steps),
        "--threads",
        str(args.threads),
        *extra,
    ]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "WANDB_SILENT": "true", "TOKENIZERS_PARALLELISM": "false"},
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return {**json.loads(line[len("RESULT ") :]), "config": name}
    raise RuntimeError(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


def median(values):
    return statistics.median(values) if values else float("nan")


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=125, help="optimiser steps per run (125 = one pass over 4,000)")
    parser.add_argument("--warmup", type=int, default=5, help="steps excluded from timing")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions of every configuration")
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    parser.add_argument("--check-steps", type=int, default=5, help="steps whose losses are compared (0: skip)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", default="qwen2-tiny", choices=["qwen2-tiny", "qwen2.5-0.5b-shape"])
    parser.add_argument(
        "--hidden",
        type=int,
        default=0,
        help="qwen2-tiny at this width (FFN 4×, heads of 32): FLOP/s fraction against width",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads in every run (0: torch's default)")
    parser.add_argument(
        "--max-busy",
        type=float,
        default=0.2,
        help="wait before each run while other processes use more than this share of the CPUs",
    )
    parser.add_argument("--max-wait", type=float, default=180, help="seconds to wait for a quiet machine per run")
    parser.add_argument("--json", type=Path, help="also write every run's numbers here")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout of the repository: its harness configurations run too, as base:<config>",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run the harness configuration once under torch.profiler and print its top operators",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--tokens-per-batch", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--supervised-per-batch", type=int, default=0, help=argparse.SUPPRESS)
    return parser


def chosen_configs(parser: argparse.ArgumentParser, args) -> list[str]:
    """``--configs`` checked against the known names, less the TRL ones when TRL is not installed."""
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in HARNESS_CONFIGS and c not in TRL_CONFIGS]
    if args.baseline and not (args.baseline / "bench" / "train_speed.py").exists():
        parser.error(f"--baseline {args.baseline}: no bench/train_speed.py there")
    if unknown:
        parser.error(f"unknown configs {unknown}; known: {', '.join([*HARNESS_CONFIGS, *TRL_CONFIGS])}")
    if any(c in TRL_CONFIGS for c in configs):
        try:
            import trl
        except ImportError:
            print("TRL is not installed (pip install -e '.[bench]'): running the harness configurations only")
            configs = [c for c in configs if c in HARNESS_CONFIGS]
        else:
            print(f"TRL {trl.__version__}")
    if args.baseline:  # each harness configuration right after itself from the baseline checkout
        configs = [v for c in configs for v in ([c, BASE + c] if c in HARNESS_CONFIGS else [c])]
    return configs


def print_setup(args, info: dict) -> None:
    import torch
    import transformers

    width = f" at hidden {args.hidden}" if args.hidden else ""
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}; device {args.device}, "
        f"torch threads {args.threads or torch.get_num_threads()}; model {args.model}{width}; "
        f"{info['examples']} examples (tokens min {info['min']} / median {info['median']} / mean "
        f"{info['mean']:.1f} / max {info['max']}), batch {args.batch_size}, {args.steps} steps, timed after "
        f"{args.warmup}"
    )


def run_profile(workdir: Path, args) -> None:
    """``--profile``: the harness configuration once, in a child that prints the profiler's tables itself."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "profile",
        "--workdir",
        str(workdir),
        "--steps",
        str(args.steps),
        "--device",
        args.device,
        "--threads",
        str(args.threads),
    ]
    subprocess.run(cmd, cwd=ROOT, check=True)


def print_loss_check(workdir: Path, args) -> None:
    """The first ``--check-steps`` losses of both sides on the same batches: evidence that they do equal work."""
    check = spawn("check", workdir, args)
    print(f"\nloss check: the first {args.check_steps} steps on the same batches, same initial weights")
    print(f"{'step':>5}{'harness':>12}{'trl-default':>14}{'trl-padding-free':>18}{'max |diff|':>12}")
    worst = 0.0
    for i, ours in enumerate(check["harness"]):
        others = [check[k][i] for k in ("trl-default", "trl-padding-free")]
        diff = max(abs(ours - o) for o in others)
        worst = max(worst, diff)
        print(f"{i + 1:>5}{ours:>12.6f}{others[0]:>14.6f}{others[1]:>18.6f}{diff:>12.2e}")
    print("losses agree" if worst < 1e-3 else "LOSSES DIFFER: the comparison is not of equal work")


def run_interleaved(workdir: Path, args, configs: list[str]) -> dict[str, list[dict]]:
    """``--reps`` rounds of every configuration (A B C … A B C …), each in a fresh process after a quiet moment."""
    results: dict[str, list[dict]] = {c: [] for c in configs}
    for rep in range(args.reps):
        for name in configs:
            busy = wait_until_quiet(args)
            r = spawn(name, workdir, args)
            r["busy_before"] = busy
            results[name].append(r)
            print(
                f"rep {rep + 1}/{args.reps} {name:<28} {r['real_tps']:>9.0f} real tok/s  {r['s_per_step']:.4f} "
                f"s/step  (other processes' CPU use before: {busy:.0%})",
                flush=True,
            )
    return results


def print_medians(args, results: dict[str, list[dict]]) -> dict[str, dict]:
    """The table of medians; returns them by configuration."""
    med = {
        name: {k: median([r[k] for r in rs]) for k in rs[0] if isinstance(rs[0][k], (int, float))}
        for name, rs in results.items()
        if rs
    }
    print(f"\nmedians of {args.reps} interleaved runs, fresh process each")
    header = (
        f"{'config':<28}{'real tok/s':>11}{'sup tok/s':>11}{'pad frac':>10}{'s/step':>9}{'peak RSS MB':>13}"
        f"{'peak GPU MB':>13}{'setup s':>9}"
    )
    print(header)
    for name, m in med.items():
        print(
            f"{name:<28}{m['real_tps']:>11.0f}{m['supervised_tps']:>11.0f}{m['pad_fraction']:>10.3f}"
            f"{m['s_per_step']:>9.4f}{m['peak_rss_mb']:>13.0f}{m.get('peak_gpu_mb', 0.0):>13.0f}"
            f"{m['setup_s']:>9.1f}"
        )
    print(f"(setup s: loading, compiling, the packing check and the {args.warmup} untimed first steps)")
    return med


def ours_names(med: dict[str, dict]) -> list[str]:
    """The harness configurations compared with TRL and with the limit: the defaults, and compiled."""
    return [n for n in ("harness", "harness-compile") if n in med]


def print_ratios_and_goals(med: dict[str, dict]) -> None:
    """Harness / TRL real tokens/s for every TRL configuration measured, and the goals (needs ``harness``)."""
    ours = med["harness"]["real_tps"]
    trl_names = [n for n in med if n in TRL_CONFIGS]
    others = [n for n in ("harness-nopacking", "harness-grouped") if n in med] + trl_names
    print("\n" + f"{'real tokens/s ratio':<32}" + "".join(f"{n:>17}" for n in ours_names(med)))
    for name in others:
        print(
            f"  vs {name:<28}"
            + "".join(f"{med[n]['real_tps'] / med[name]['real_tps']:>16.2f}×" for n in ours_names(med))
        )

    def verdict(ok):
        return "met" if ok else "NOT met"

    goals = []
    if "harness-nopacking" in med:
        r = ours / med["harness-nopacking"]["real_tps"]
        goals.append(
            f"vs the defaults without packing (harness-nopacking) {r:.2f}× (goal ≥ 1.25: {verdict(r >= 1.25)})"
        )
    if "trl-default" in med:
        r = ours / med["trl-default"]["real_tps"]
        goals.append(f"vs TRL's default {r:.2f}× (goal ≥ 3.5: {verdict(r >= 3.5)})")
    stock = [n for n in trl_names if TRL_CONFIGS[n].get("gradient_checkpointing", True)]
    if stock:  # TRL's own defaults, plus padding_free, BFD packing or group_by_length
        best = max(stock, key=lambda n: med[n]["real_tps"])
        r = ours / med[best]["real_tps"]
        goals.append(
            f"vs the best of TRL's default / padding_free / bfd packing / group_by_length ({best}) "
            f"{r:.2f}× (goal ≥ 1.5: {verdict(r >= 1.5)})"
        )
    best = max(trl_names, key=lambda n: med[n]["real_tps"]) if trl_names else None
    if best is not None and best not in stock:
        r = ours / med[best]["real_tps"]
        goals.append(
            f"vs the best TRL configuration measured, gradient checkpointing off as well ({best}) "
            f"{r:.2f}× (≥ 1.5: {verdict(r >= 1.5)})"
        )
    pad = med["harness"]["pad_fraction"]
    goals.append(f"pad fraction {pad:.3f} (goal ≤ 0.02: {verdict(pad <= 0.02)})")
    print("goals, harness at its defaults:")
    print("\n".join("  " + g for g in goals))


def print_overhead(med: dict[str, dict], results: dict[str, list[dict]]) -> None:
    """What the non-finite guard and the health metrics cost: tokens/s with them off against ``harness`` (and, with
    ``--baseline``, the same for the baseline's code): the ratio of medians, then each repetition's own ratio (the
    two runs of one round ran next to each other)."""
    for prefix in ("", BASE):
        overhead = [prefix + n for n in ("harness-noguard", "harness-nodiag", "harness-bare") if prefix + n in med]
        if overhead and prefix + "harness" in med:
            code = "the baseline's code" if prefix else "this code"
            print(f"\nguard and health metrics ({code}): tokens/s with them off, relative to the defaults (on)")
            ours = med[prefix + "harness"]["real_tps"]
            for name in overhead:
                settings = HARNESS_CONFIGS[name[len(prefix) :]]
                pairs = zip(results[name], results[prefix + "harness"])
                per_rep = ", ".join(f"{a['real_tps'] / b['real_tps']:.3f}" for a, b in pairs)
                print(f"  {name:<27}{med[name]['real_tps'] / ours:>6.3f}×  [{per_rep}]  ({settings})")


def print_limits(workdir: Path, args, results: dict[str, list[dict]], med: dict[str, dict]) -> None:
    """Close to the limit: the harness's training FLOP/s against this machine's matmul rate on the model's shapes
    (measured in a child at the batches' token counts) and on one large square matmul (needs ``harness``)."""
    runs = results["harness"]
    tokens_per_batch = round(runs[0]["padded_tokens"] / runs[0]["steps"])
    supervised_per_batch = round(runs[0]["supervised_tokens"] / runs[0]["steps"])
    mm = spawn(
        "matmul",
        workdir,
        args,
        ["--tokens-per-batch", str(tokens_per_batch), "--supervised-per-batch", str(supervised_per_batch)],
    )
    flops = harness_flops(workdir, args)
    print(f"\nclose to the limit ({mm['dtype']} matmul, {tokens_per_batch} tokens per batch):")
    print(
        f"  torch.matmul on the model's shapes (forward and backward products): "
        f"{mm['model_shapes'] / 1e9:.1f} GFLOP/s; one large square matmul: {mm['square'] / 1e9:.1f} GFLOP/s"
    )
    for name in ours_names(med):
        tps = med[name]["real_tps"]
        rate = flops["flops"] * tps / max(1, flops["real_tokens"])
        rate_6nt = flops["flops_6nt"] * tps / max(1, flops["real_tokens"])
        print(
            f"  {name}: {rate / 1e9:.1f} GFLOP/s (6·N_body·T + 6·N_head·T_supervised + attention) = "
            f"{rate / mm['model_shapes']:.2f} of the model-shape matmul rate (goal ≥ 0.5), "
            f"{rate / mm['square']:.2f} of the square one; as 6·N·T + attention (head at every token, "
            f"{rate_6nt / 1e9:.1f} GFLOP/s): {rate_6nt / mm['model_shapes']:.2f}"
        )
        if args.device == "cuda":
            print(f"    MFU (vs measured bf16 matmul peak): {rate / mm['square']:.2f}")


def main() -> None:
    parser = arguments()
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no GPU on this machine (torch.cuda.is_available() is False): the CUDA bench is skipped")
        return
    configs = chosen_configs(parser, args)
    workdir = Path(tempfile.mkdtemp(prefix="train-speed-"))
    info = prepare(workdir, args)
    print_setup(args, info)
    if args.profile:
        run_profile(workdir, args)
        return
    if args.check_steps and any(c in TRL_CONFIGS for c in configs):
        print_loss_check(workdir, args)
    results = run_interleaved(workdir, args, configs)
    med = print_medians(args, results)
    if "harness" in med:
        print_ratios_and_goals(med)
        print_overhead(med, results)
        print_limits(workdir, args, results, med)
    if args.json:
        args.json.write_text(json.dumps({"info": info, "runs": results, "medians": med}, indent=2))


if __name__ == "__main__":
    main()
