"""The stage cache's key (:func:`stage_keys`): one key per stage, each covering its stage and every earlier one, so a
run replays the longest prefix of stages computed before from the same input, code and machine, and never one that
different input, code or kernels would compute otherwise (:mod:`harness.runs.execution.stage_cache` keeps the entries).

The key chains: stage k's key hashes stage k-1's key with stage k's resolved spec (every train field except those
that only say what to keep on disk: ``checkpoint``, ``checkpoint_every``, ``keep_checkpoints``, ``stage_cache``;
``compile`` as decided, :func:`harness.training.compiling.compile_decision`, so ``auto`` and ``true`` share a
compiled stage),
and stage 0's hashes what every stage depends on: the whole resolved experiment except the stages and the fields in
:data:`NOT_SHAPING` (each listed with why it cannot change a stage's numbers; a field added to the schema is in the
key unless it is added there), so the top-level ``train`` section too (evaluation items are fitted with its
``max_length``); the base model's key, the content of the task data, the hash of the code that shapes a stage's
numbers (:func:`harness.runs.planning.code_identity.code_fingerprint`, with the plug-ins the run uses and the modules
they import), the harness, torch and transformers versions and the device (on a CPU, with its torch thread count; with
several data-parallel ranks, their number) (numerics differ across them), and what else computes a stage
(:func:`harness.runs.planning.code_identity.environment`: peft's and the optional kernels' versions, the CPU kernel path
— torch's CPU capability, the BLAS's and oneDNN's instruction sets —, the GPU's model; with benchmarks, lm-eval's
version and the content of each ``include_path``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

import harness
from harness.config import Experiment, computing_debug
from harness.core.digests import content_hash
from harness.runs.planning.code_identity import code_fingerprint, environment, run_plugins
from harness.training.compiling import compile_decision

# Bump when an entry's layout or what a key covers changes (2: samples carry per-item outcomes for the paired seesaw;
# 3: rows keep their n and Wilson interval, which entries of 2 dropped; 4: the key covers the whole experiment but
# NOT_SHAPING, and the code — entries of 3 miss once; evaluations add the choice rows of two-answer tasks, which
# entries of 3 lack; 5: the key covers peft's, the kernels' and lm-eval's versions, the GPU's model and the content of
# benchmark include paths, and the code hash leaves out editor leftovers and modules run after training; 6: the key
# covers the CPU kernel path, and the plug-ins the run uses with their own modules, by name and content, not path)
STAGE_CACHE_VERSION = "6"
# Train fields that decide what a run keeps on disk, not what a stage computes: out of a stage's part of the key.
STAGE_NOT_SHAPING = frozenset({"checkpoint", "checkpoint_every", "keep_checkpoints", "stage_cache"})
# The only fields of an experiment left out of the stage-cache key, each with why it cannot change a stage's numbers
# (paths as in the YAML; a ``train.X`` of STAGE_NOT_SHAPING also stands for ``stages[i].X``).
# tests/runs/test_stage_cache_key.py changes every field of the schema one at a time and checks that it misses unless it
# is listed here.
NOT_SHAPING = {
    "name": "the experiment's label: it names the run directory and the entry's meta, not what is computed",
    "seeds": "the list of replicates `harness run` starts; each replicate's own seed (seed) is in the key",
    "tracking": "where rows go (wandb, console), not what they are",
    "plugins": "where the plug-ins are (a file's absolute path): the code hash holds the plug-ins the run uses, with "
    "the modules they import, by name and content (code_identity.run_plugins)",
    **{
        f"train.{k}": "what the run keeps on disk (checkpoints, cache use), not what a stage computes"
        for k in sorted(STAGE_NOT_SHAPING)
    },
    "train.compile": "the top-level setting never runs as such: each stage's key holds its own compile decision "
    "(auto and false share an eager stage)",
    "debug.kill_rank": "only stops a run; a stage it stopped is never stored",
}


def base_key(base_info: dict[str, Any], model) -> Any:
    """What identifies the base model beyond the experiment's model spec: the pretraining cache key of a builtin
    model, the hub commit of a hub model, the files (name, size, mtime) of a local one."""
    if base_info.get("cache_dir"):
        return Path(base_info["cache_dir"]).name  # the pretraining cache's key
    source = base_info.get("source")
    local = Path(str(source)) if source else None
    files = None
    if local is not None and local.is_dir():
        files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in local.iterdir() if p.is_file())
    return {"source": source, "commit": getattr(model.config, "_commit_hash", None), "files": files}


def _ranks() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def stage_keys(exp: Experiment, base: Any, data_hash: str, device: str, code: str | None = None) -> list[str]:
    """One key per stage, each covering its stage and every earlier one (see the module docstring). ``code``: the
    hash of the code that shapes a stage (default :func:`harness.runs.planning.code_identity.code_fingerprint`)."""
    # peft's and the optional kernels' versions, the CPU kernel path, the GPU, lm-eval, the user's benchmark tasks and
    # reference text
    computing = environment(device, exp.eval.benchmarks, exp.eval.reference_text)
    code = code if code is not None else code_fingerprint(plugins=run_plugins(exp))
    resolved = exp.resolved_dict()
    shared = {k: v for k, v in resolved.items() if k not in NOT_SHAPING and k != "stages"}
    shared["train"] = {k: v for k, v in resolved["train"].items() if f"train.{k}" not in NOT_SHAPING}
    # debug.kill_rank only stops a run (a stage it stopped is never stored): not part of the key
    shared["debug"] = computing_debug(resolved["debug"])
    common = {
        "cache": STAGE_CACHE_VERSION,
        "harness": harness.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
        "base": base,
        "code": code,
        "environment": computing,
        # on a CPU the intra-op thread count changes the order of float sums: a stage computed with 2 threads
        # is not bit-identical to the same stage computed by a 1-thread sweep worker
        "cpu_threads": torch.get_num_threads() if device == "cpu" else None,
        "task_data": data_hash,
        "experiment": shared,
        # data-parallel ranks add the same gradient terms in another order: not one process's stage either
        **({"ranks": _ranks()} if _ranks() > 1 else {}),
    }
    keys, previous = [], content_hash(common)
    for index, stage in enumerate(resolved["stages"]):
        shaping = {k: v for k, v in stage.items() if k not in STAGE_NOT_SHAPING}
        # What runs, not the setting: compiled kernels change the last bits, and auto decides per stage and machine
        shaping["compile"] = compile_decision(stage["compile"], stage["steps"], device)
        previous = content_hash({"previous": previous, "index": index, "stage": shaping})
        keys.append(previous[:32])
    return keys
