"""GPU check: the harness's own path on CUDA — ``harness run … --nproc 2`` (NCCL) with the non-finite guard on, a
stage-cache replay, a killed rank and its ``--resume``, a NaN on one rank, and an fsdp run — each a ``python -m
harness`` command on the micro experiment (tests/data/micro.yaml), checked against the first run — then a bf16-autocast
run (the packing check's verdict and tolerance per stage), an adaptive stage (the steering all-reduce) and a packed
bf16 run on the Qwen2.5-0.5B shape (experiments/real_size.yaml, when present). Prints one line per check and exits 1
if any failed, 0 otherwise.

    python bench/gpu_check.py            # on a machine with CUDA; without one it says so and exits 0
    python bench/gpu_check.py --cpu      # the same commands on the CPU (gloo): tries the script itself

With 2 or more GPUs every run uses 2 ranks (``--nproc 2``: NCCL, one GPU per rank). With one GPU the runs are one
process on it: the guard, the stage cache, resume points and the CUDA generators are checked, the collectives are
not (they need two ranks), and the output says so.

The last stage trains a LoRA adapter with dropout 0.3 — dropout on a GPU draws from each rank's own CUDA generator —
so the replay (stages 1–2 from the stage cache, stage 3 trained) and the resume (killed at step 100, resumed from its
step-90 resume point) continue from the generators as they were: their stage-3 training losses must match the
uninterrupted run's. Eager CUDA kernels are not all deterministic (atomic adds in backward passes), so "match" is
a relative difference ≤ 1e-4 per step (a wrong dropout mask moves the loss by far more); exact equality is printed
when it holds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
MICRO = ROOT / "tests" / "data" / "micro.yaml"
# Every run: a log row every step, resume points every 15 steps (all kept), wandb off, the guard on (stop: exit 3)
# and the last stage a LoRA adapter whose dropout draws from the CUDA generators.
COMMON = [
    "--set",
    "train.log_every=1",
    "--set",
    "train.checkpoint_every=15",
    "--set",
    "train.keep_checkpoints=20",
    "--set",
    "tracking.wandb.mode=disabled",
    "--set",
    "train.nonfinite=stop",
    "--set",
    "stages.assistant.trainable={mode: lora, r: 8, dropout: 0.3}",
]
LORA_STEPS = range(81, 141)  # the LoRA stage's steps (40 + 40 before it)
MATCH = 1e-4  # relative, per step


def harness(out: Path, *args: str, env: dict, nproc: int, resume: bool = False) -> tuple[int, str, float]:
    """``python -m harness run MICRO --out OUT …`` (``--resume OUT`` with ``resume``; ``--nproc`` when several
    ranks); (exit code, stderr, seconds)."""
    cmd = [
        sys.executable,
        "-m",
        "harness",
        "run",
        str(MICRO),
        "--resume" if resume else "--out",
        str(out),
        *COMMON,
        *args,
    ]
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    return done.returncode, done.stderr, time.monotonic() - started


def train_losses(run: Path, steps=None) -> dict[int, float]:
    import polars as pl

    from harness.core.store import read_metrics

    rows = read_metrics(run).filter(pl.col("split") == "train", pl.col("metric") == "loss", pl.col("task").is_null())
    return {s: v for s, v in zip(rows["step"].to_list(), rows["value"].to_list()) if steps is None or s in steps}


def compare(a: dict[int, float], b: dict[int, float]) -> tuple[bool, str]:
    """Same steps and every loss within :data:`MATCH` (relative): (ok, what was measured)."""
    if not a or a.keys() != b.keys():
        return False, f"steps differ ({len(a)} vs {len(b)} rows)"
    worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
    exact = all(a[s] == b[s] for s in a)
    return worst <= MATCH, f"{len(a)} steps, max relative difference {worst:.2e}" + (
        " (bit-identical)" if exact else ""
    )


class Report:
    def __init__(self):
        self.failed = 0

    def line(self, name: str, ok: bool, detail: str) -> None:
        self.failed += not ok
        print(f"{'ok    ' if ok else 'FAILED'} {name}: {detail}", flush=True)


def run_checks(work: Path, env: dict, nproc: int, report: Report) -> None:
    full, replay, killed, nan, fsdp = (work / n for n in ("full", "replay", "killed", "nan", "fsdp"))
    code, err, seconds = harness(full, env=env, nproc=nproc)
    report.line("train (guard on, stage cache stores)", code == 0, f"exit {code}, {seconds:.0f} s" + _tail(code, err))
    if code != 0:
        return
    losses = train_losses(full)
    report.line(
        "training losses finite",
        len(losses) == 140 and all(math.isfinite(v) for v in losses.values()),
        f"{len(losses)} steps",
    )

    # Stages 1-2 replayed from the entries the first run stored; the LoRA stage trains from their generators.
    code, err, seconds = harness(replay, "--set", "stages.assistant.stage_cache=false", env=env, nproc=nproc)
    summary = json.loads((replay / "summary.json").read_text()) if code == 0 else {"stages": []}
    cached = [s["name"] for s in summary["stages"] if s.get("cached_from")]
    report.line(
        "stage-cache replay",
        code == 0 and cached == ["repeat_only", "short"],
        f"exit {code}, replayed {cached}, {seconds:.0f} s" + _tail(code, err),
    )
    if code == 0:
        ok, detail = compare(train_losses(full, LORA_STEPS), train_losses(replay, LORA_STEPS))
        report.line("replayed generators: LoRA-stage losses match the uninterrupted run", ok, detail)

    # The last rank SIGKILLs itself before step 100; --resume continues from the step-90 resume point.
    no_cache = ["--set", "train.stage_cache=false"]
    code, err, _ = harness(
        killed, *no_cache, "--set", f"debug.kill_rank={{rank: {nproc - 1}, step: 100}}", env=env, nproc=nproc
    )
    sigkill = 128 + 9 if nproc > 1 else -9  # the launcher's exit code, or the one process's own death
    report.line("killed rank stops the run", code == sigkill, f"exit {code}" + _tail(code != sigkill, err))
    code, err, seconds = harness(killed, *no_cache, env=env, nproc=nproc, resume=True)
    report.line("--resume", code == 0, f"exit {code}, {seconds:.0f} s" + _tail(code, err))
    if code == 0:
        resumed_from = json.loads((killed / "summary.json").read_text()).get("resumed_from")
        ok, detail = compare(train_losses(full, range(91, 141)), train_losses(killed, range(91, 141)))
        report.line(
            "resumed generators: losses after the resume point match",
            ok and resumed_from == "step-00000090",
            f"resumed from {resumed_from}; {detail}",
        )

    # A NaN in the last rank's forward at step 3: every rank stops (exit 3), the report names that rank.
    code, err, _ = harness(
        nan,
        "--set",
        f"debug.inject_nonfinite={{step: 3, where: forward, module: 'layers\\.0\\.mlp$', rank: {nproc - 1}}}",
        env=env,
        nproc=nproc,
    )
    report_file = nan / "nonfinite.json"
    named = json.loads(report_file.read_text()) if report_file.exists() else {}
    report.line(
        "NaN on one rank stops the run",
        code == 3
        and named.get("step") == 3
        and named.get("rank", 0) == nproc - 1
        and named.get("first_module") == "model.layers.0.mlp",
        f"exit {code}, report: rank {named.get('rank')}, step {named.get('step')}, module {named.get('first_module')}",
    )

    if nproc > 1:  # FSDP2 over the ranks: the first stage's losses as DDP's (another summation order)
        code, err, seconds = harness(fsdp, *no_cache, "--set", "train.parallel=fsdp", env=env, nproc=nproc)
        report.line("train.parallel: fsdp", code == 0, f"exit {code}, {seconds:.0f} s" + _tail(code, err))
        if code == 0:
            a, b = train_losses(full, range(1, 41)), train_losses(fsdp, range(1, 41))
            worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a) if a.keys() == b.keys() else float("inf")
            report.line("fsdp's first-stage losses within 1e-3 of ddp's", worst <= 1e-3, f"max relative {worst:.2e}")


def run_precision_and_steering_checks(work: Path, env: dict, nproc: int, report: Report) -> None:
    """bf16 autocast (with the packing check's verdict and the tolerance it used), an adaptive stage (the steering
    all-reduce of each rank's per-task loss sums: NCCL takes no CPU tensor), and a packed run on the Qwen2.5-0.5B
    shape (experiments/real_size.yaml, flash-attention's varlen kernels where installed)."""
    no_cache = ["--set", "train.stage_cache=false"]
    bf16 = work / "bf16"
    code, err, seconds = harness(bf16, *no_cache, "--set", "train.precision=bf16-autocast", env=env, nproc=nproc)
    report.line("bf16-autocast run", code == 0, f"exit {code}, {seconds:.0f} s" + _tail(code, err))
    if code == 0:
        losses = train_losses(bf16)
        packing = _packing_rows(bf16)
        report.line(
            "bf16: losses finite, packing decided per stage",
            len(losses) == 140 and all(math.isfinite(v) for v in losses.values()) and len(packing) == 3,
            f"{len(losses)} steps; per stage (packed, max rel diff, tolerance): {packing}",
        )
    steer = work / "steer"
    code, err, seconds = harness(
        steer, *no_cache, "--set", "stages.short.mixture={adaptive: {method: odm}}", env=env, nproc=nproc
    )
    report.line("adaptive stage (steering all-reduce)", code == 0, f"exit {code}, {seconds:.0f} s" + _tail(code, err))
    real = ROOT / "experiments" / "real_size.yaml"
    if real.exists():
        cmd = [sys.executable, "-m", "harness", "run", str(real), "--out", str(work / "real"), *no_cache]
        cmd += ["--set", "train.precision=bf16-autocast"] + (["--nproc", str(nproc)] if nproc > 1 else [])
        started = time.monotonic()
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        seconds = time.monotonic() - started
        packing = _packing_rows(work / "real") if done.returncode == 0 else "-"
        report.line(
            "Qwen2.5-0.5B shape, bf16, packed",
            done.returncode == 0,
            f"exit {done.returncode}, {seconds:.0f} s; packing {packing}" + _tail(done.returncode, done.stderr),
        )


def _packing_rows(run: Path) -> list[tuple]:
    """Each stage's packing rows: (packed, max relative difference, tolerance), in stage order."""
    import polars as pl

    from harness.core.store import read_metrics

    rows = read_metrics(run).filter(pl.col("metric").is_in(["packed", "packing_max_rel_diff", "packing_tolerance"]))
    by_stage: dict[str, dict[str, float]] = {}
    for stage, metric, value in zip(rows["stage"], rows["metric"], rows["value"]):
        by_stage.setdefault(stage, {})[metric] = value
    return [
        (
            int(m.get("packed", -1)),
            f"{m.get('packing_max_rel_diff', float('nan')):.2e}",
            f"{m.get('packing_tolerance', float('nan')):.2e}",
        )
        for m in by_stage.values()
    ]


def _tail(failed, err: str) -> str:
    return ("\n" + "\n".join("    " + line for line in err.strip().splitlines()[-8:])) if failed else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="run the same commands on the CPU (2 gloo ranks)")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it (default: a temporary one)")
    args = parser.parse_args()
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    if args.cpu:
        env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
        nproc, where = 2, "the CPU (gloo; --cpu: a check of this script, not of CUDA)"
    elif not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device visible — skipped, nothing was checked (the CPU tests cover the rest; "
            "--cpu runs these commands on the CPU)"
        )
        return 0
    else:
        gpus = torch.cuda.device_count()
        nproc = 2 if gpus >= 2 else 1
        names = sorted({torch.cuda.get_device_name(i) for i in range(gpus)})
        where = f"{gpus} GPU(s) ({', '.join(names)}), torch {torch.__version__}; " + (
            "2 ranks (NCCL, one GPU each)"
            if nproc == 2
            else "one process on cuda:0 — one GPU: the collectives (NCCL) are NOT checked, only the guard, the "
            "stage cache, resume points and the CUDA generators"
        )
    print(f"gpu_check on {where}", flush=True)
    report, started = Report(), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        env["HARNESS_CACHE"] = str(work / "cache")  # a fresh cache: the replay reads what the first run stored
        run_checks(work, env, nproc, report)
        run_precision_and_steering_checks(work, env, nproc, report)
    print(f"gpu_check: {report.failed} failed, {time.monotonic() - started:.0f} s in all", flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
