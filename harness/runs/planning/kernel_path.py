"""The CPU kernel path a stage's float operations take (:func:`kernel_path`), as the stage-cache key holds it
(:func:`harness.runs.planning.code_identity.environment`): torch's own kernels' instruction set, the BLAS's (MKL's, as
MKL reports it) and oneDNN's settings. ``docs/kernel_paths.md`` says which switch moves which numbers, and
``bench/kernel_path.sh`` moves them together (``--show`` prints this module's report).

It imports only torch, so a shell can ask for the path cheaply."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from functools import lru_cache
from typing import Any

import torch

# oneDNN reports its instruction set only on a primitive's first run, with verbose output on: these, as set, are
# what moves it (the older DNNL_ names are still read)
ONEDNN_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ONEDNN_CPU_ISA_HINTS", "DNNL_CPU_ISA_HINTS")
BLAS_VARIABLES = ("MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "OPENBLAS_CORETYPE")


@lru_cache(maxsize=1)
def kernel_path() -> dict[str, Any]:
    """The CPU kernel path a stage's float operations take (``docs/kernel_paths.md``): torch's own kernels'
    instruction set (``torch.backends.cpu.get_cpu_capability``, which honours ``ATEN_CPU_CAPABILITY``), the BLAS's as
    MKL reports it (:func:`mkl_path`; with another BLAS, its variables as set), and oneDNN's variables as set. Two
    paths compute the same stage with different last bits, and a tiny model trained from scratch turns those into a
    different run. Computed once per process (the libraries read their variables once, at load)."""
    path: dict[str, Any] = {"torch_cpu": torch.backends.cpu.get_cpu_capability()}
    blas = mkl_path() if torch.backends.mkl.is_available() else None
    path["blas"] = blas or {name: os.environ[name] for name in BLAS_VARIABLES if name in os.environ}
    path["onednn"] = {name: os.environ[name] for name in ONEDNN_VARIABLES if name in os.environ}
    return path


def mkl_path() -> dict[str, str] | None:
    """What MKL says of the code path it dispatches to: the first line of its verbose output (version, instruction
    set — ``MKL_ENABLE_INSTRUCTIONS`` as it took it —, threading layer; the clock speed dropped) and its conditional
    reproducibility mode (``CNR``, set by ``MKL_CBWR``), read from a tiny product run with verbose output on and the
    process's standard output redirected for it. None when it says nothing (MKL prints that line once per process: a
    process that had verbose output on before; or the output cannot be redirected)."""
    a = torch.ones(4, 4)
    try:
        sys.stdout.flush()
        with tempfile.TemporaryFile() as captured:
            saved = os.dup(1)
            try:
                os.dup2(captured.fileno(), 1)
                with torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON):
                    torch.mm(a, a)
            finally:
                os.dup2(saved, 1)
                os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    header = [line for line in lines if line.startswith("MKL_VERBOSE") and "architecture" in line]
    call = re.search(r"CNR:(\S+)", "\n".join(lines))
    if not header:
        return None
    return {"mkl": re.sub(r"\s*[\d.]+GHz", "", header[0].removeprefix("MKL_VERBOSE ")), "cnr": call[1] if call else ""}
