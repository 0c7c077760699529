"""Whether an experiment gives the same run with the chunked loss forced on and off (issue 54): every value of
``metrics.parquet`` and every field of every ``samples.jsonl`` record, compared exactly, and where they differ, how
far against the same run summed in another order.

Three runs of ``CONFIG``, each in a fresh process at one torch thread (``OMP_NUM_THREADS=1``, ``MKL_NUM_THREADS=1``,
``torch.set_num_threads(1)``: ``harness run`` has no thread setting of its own), without the stage cache
(``train.stage_cache=false``: each stage trains) and with wandb off, through
:func:`harness.runs.execution.runner.run_experiment` as ``harness run CONFIG --set ...`` calls it:

- ``off``: ``train.loss_chunking=false`` (the unchunked path);
- ``on``: ``train.loss_chunking=true``, ``train.loss_chunk_tokens=K`` (``--chunk-tokens``; a step whose N
  supervised tokens are at most K runs unchunked, :meth:`harness.training.chunked_loss.Chunking.chunk_rows`, so K
  is small enough that every step makes several chunks: the chunks per step are counted and printed);
- ``reordered``: ``off`` with every training batch's examples in reverse order, padded or packed (the same examples
  and the same loss, each sum over tokens taken in another order) — the reference for how far rounding alone moves
  this run on this CPU, as ``tests/conftest.py``'s ``rows_reversed_run`` is for the data-parallel tests. (Reversing
  only the padded collation leaves a packed run bit-identical: its batches are built by
  :func:`harness.data.packed_batches.pack_encoded`, which this reverses too.)

Comparison of ``on`` and of ``reordered`` against ``off``: metrics rows matched on stage, step, task, split and
metric (``tokens_per_s``, a timing, left out), their value, n, interval and text compared; per metric the rows
that differ, the largest absolute and relative (``|a − b| / max(|a|, |b|)``) difference and the first (stage,
step) that differs. ``samples.jsonl`` records in order (``run_id`` left out), every field, nested ones too
(``top5.*.prob``): per field the records that differ and, for numbers, the largest differences.

The tolerance, derived from the reordered run as the repository's other cross-configuration comparisons derive
theirs: a continuous value (losses, norms, eval loss, ...) per metric and stage within ``DRIFT_FACTOR`` (30,
tests/conftest.py: a whole run, where rounding differences grow chaotically) × the reordered run's largest
relative difference, floored at two fp32 ulps; how many pairs also lie within the exactness tests' one-step
``SAFETY`` (4) is printed beside it. A metric made of per-item decisions (ranks, argmaxes, counts) moves by a whole
item when rounding flips one, so it is judged item by item: a greedy first token that differs must have had, in
``off``, a log-probability margin below 2 × the largest first-token |Δ log p| the reordered run shows at that
evaluation (a reordering that moves log-probabilities by Δ can swap tokens less than 2Δ apart). Predictions that
part after an equal first token carry no margin in ``samples.jsonl``: counted, not judged. Once the reordered run
itself flips items past their margins (a run long enough for rounding to grow into another trajectory), no
item-level tolerance follows from it: the discrete outcomes are then reported side by side (records differing
per field), not judged. The comparison itself: bench/identity_compare.py. Exit 0 when identical or within.

    python bench/chunked_identity.py                                     # tests/data/micro.yaml
    python bench/chunked_identity.py experiments/quickstart.yaml --jobs 2
    python bench/chunked_identity.py --compare-only --out DIR            # the runs already under DIR

The base model is pretrained (or found in the cache) first, in a process of its own, so that every arm loads the
same one from the cache. ``--jobs 2`` runs ``off`` first, then ``on`` and ``reordered`` side by side. Figures:
docs/performance.md (the loss at a real vocabulary, chunked).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's harness, in the children too

from bench.identity_compare import compare  # noqa: E402

ARMS = ("off", "on", "reordered")
COMMON = ["train.stage_cache=false", "tracking.wandb.mode=disabled"]


def arm_overrides(arm: str, chunk_tokens: int) -> list[str]:
    chunking = ["train.loss_chunking=true", f"train.loss_chunk_tokens={chunk_tokens}"]
    return COMMON + (chunking if arm == "on" else ["train.loss_chunking=false"])


# ---------------------------------------------------------------------------------------------------------------------
# One run (a child process)
# ---------------------------------------------------------------------------------------------------------------------


def child(arm: str, config: str, out: Path, overrides: list[str]) -> None:
    """Run ``config`` into ``out``; write the seconds and every loss call's (N, rows per chunk) beside it."""
    import torch

    from harness.config.load import load_experiment
    from harness.data import images
    from harness.runs.execution import packing_decision as packing  # where a stage's rows are packed
    from harness.runs.execution.runner import run_experiment
    from harness.training import chunked_loss

    torch.set_num_threads(1)
    if arm == "warm":
        from harness.runs.planning.prepare import warm_base

        print(f"base: {warm_base(load_experiment(config))}")
        return
    calls: list[tuple[int, int | None]] = []
    decide = chunked_loss.Chunking.chunk_rows

    def counted(self, n_supervised: int, vocab: int):
        rows = decide(self, n_supervised, vocab)
        calls.append((n_supervised, rows))
        return rows

    chunked_loss.Chunking.chunk_rows = counted
    if arm == "reordered":
        collate, pack_encoded = images.collate, packing.pack_encoded
        images.collate = lambda examples, pad_id: collate(list(examples)[::-1], pad_id)
        packing.pack_encoded = lambda examples, *a, **k: pack_encoded(list(examples)[::-1], *a, **k)
    started = time.perf_counter()
    run_experiment(load_experiment(config, overrides), out)
    seconds = time.perf_counter() - started
    (out.parent / f"{out.name}.json").write_text(json.dumps({"seconds": seconds, "calls": calls}))


def one_thread() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def launch(arm: str, config: str, out: Path, chunk_tokens: int) -> subprocess.Popen:
    env = one_thread()
    args = [sys.executable, __file__, "--child", arm, config, "--out", str(out / arm)]
    args += [f"--set={s}" for s in arm_overrides(arm, chunk_tokens)]
    log = open(out / f"{arm}.log", "w")
    print(f"[{time.strftime('%H:%M:%S')}] {arm}: {' '.join(args[1:])}", flush=True)
    return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def run_all(config: str, out: Path, chunk_tokens: int, jobs: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    settings = {"config": config, "chunk_tokens": chunk_tokens, "jobs": jobs, "started": time.strftime("%F %T %Z")}
    (out / "settings.json").write_text(json.dumps(settings))
    # The base first, so that every arm loads the same one from the cache (none uses the in-memory model that
    # pretraining leaves, which one arm otherwise would).
    warm = subprocess.run([sys.executable, __file__, "--child", "warm", config], env=one_thread(), cwd=ROOT)
    if warm.returncode != 0:
        sys.exit("pretraining the base failed")
    waves = [["off"], ["on", "reordered"]] if jobs > 1 else [[a] for a in ARMS]
    for wave in waves:
        running = {arm: launch(arm, config, out, chunk_tokens) for arm in wave}
        for arm, process in running.items():
            if process.wait() != 0:
                sys.exit(f"{arm} failed (exit {process.returncode}): see {out / (arm + '.log')}")
            print(f"[{time.strftime('%H:%M:%S')}] {arm} done", flush=True)


def chunk_summary(out: Path, arm: str) -> str:
    info = json.loads((out / f"{arm}.json").read_text())
    chunked = [math.ceil(n / rows) for n, rows in info["calls"] if rows]
    text = f"{arm}: {info['seconds'] / 60:.1f} min"
    if arm == "on":
        n = [n for n, rows in info["calls"] if rows]
        text += (
            f"; {len(chunked)} loss calls chunked (chunks per call min {min(chunked, default=0)}, median "
            f"{statistics.median(chunked) if chunked else 0:g}, max {max(chunked, default=0)}; N "
            f"{min(n, default=0)}-{max(n, default=0)}), {len(info['calls']) - len(chunked)} not (N ≤ chunk)"
        )
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?", default="tests/data/micro.yaml")
    ap.add_argument("--out", type=Path, help="where the runs go (default runs/chunked-identity/<name>-<time>)")
    ap.add_argument("--chunk-tokens", type=int, default=8, help="train.loss_chunk_tokens of the chunked run")
    ap.add_argument("--jobs", type=int, choices=(1, 2), default=1, help="2: on and reordered side by side")
    ap.add_argument("--compare-only", action="store_true", help="compare the runs already under --out")
    ap.add_argument("--child", choices=(*ARMS, "warm"), help=argparse.SUPPRESS)
    ap.add_argument("--set", action="append", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.config, args.out, args.set)
        return 0
    out = args.out or ROOT / "runs" / "chunked-identity" / f"{Path(args.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.compare_only:
        if args.out is None:
            ap.error("--compare-only needs --out")
    else:
        run_all(args.config, out, args.chunk_tokens, args.jobs)
    settings = json.loads((out / "settings.json").read_text())
    print(
        f"{settings['config']}, runs under {out} (started {settings['started']}, --jobs {settings['jobs']}), "
        f"train.loss_chunk_tokens={settings['chunk_tokens']}, 1 thread each"
    )
    for arm in ARMS:
        print(chunk_summary(out, arm))
    return 0 if compare(out, ARMS) else 1


if __name__ == "__main__":
    sys.exit(main())
