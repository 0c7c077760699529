"""A stand-in for SLURM on one machine, for the launcher's tests: ``sbatch``, ``sacct``, ``squeue``, ``scancel``,
``scontrol`` and ``srun`` are small scripts (:func:`install`) that call this file, which keeps the cluster's state
under ``$FAKE_SLURM_DIR``:

- ``calls.jsonl``: every command with its arguments, one JSON line each;
- ``scripts/<id>.sh``: each script sbatch was given, as given;
- ``jobs/<job>.json``: each job's (array task's) state, pids, exit code, restarts and requeue / cancel flags;
- ``env/<job>.<attempt>.json``: the environment each job's task (srun's command) got.

sbatch runs each job (each array task) at once, locally, as ``bash <script>`` in its own session, with the SLURM
variables a job gets (``SLURM_JOB_ID``, ``SLURM_ARRAY_*``, ``SLURM_RESTART_COUNT``, …); ``scontrol requeue`` runs it
again once it has exited; ``scancel ID`` kills it (CANCELLED), ``scancel ID --signal SIG`` signals its task, as
submitit's ``_interrupt`` does to simulate a preemption.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = ("sbatch", "sacct", "squeue", "scancel", "scontrol", "srun")


def install(bin_dir: Path, state: Path) -> None:
    """Write the commands into ``bin_dir`` (to put first on PATH) with ``state`` as the cluster's state."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("scripts", "jobs", "env"):
        (state / name).mkdir(parents=True, exist_ok=True)
    for command in COMMANDS:
        path = bin_dir / command
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" {command} "$@"\n')
        path.chmod(0o755)


def _state() -> Path:
    return Path(os.environ["FAKE_SLURM_DIR"])


@contextlib.contextmanager
def _locked():
    with open(_state() / "lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_job(key: str) -> dict:
    path = _state() / "jobs" / f"{key}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _write_atomically(path: Path, text: str) -> None:
    """Written beside and renamed into place: the tests read these files while the fake commands write them (a
    half-written file read as JSON failed under load)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def _update(key: str, **fields) -> dict:
    with _locked():
        job = {**read_job(key), **fields}
        _write_atomically(_state() / "jobs" / f"{key}.json", json.dumps(job))
        return job


def _keys(job_id: str) -> list[str]:
    """The jobs an id names: one array task (``1000_2``), or a job with every task of its array (``1000``)."""
    found = [p.stem for p in (_state() / "jobs").glob("*.json")]
    return sorted(k for k in found if k == job_id or k.startswith(f"{job_id}_"))


def sbatch(args: list[str]) -> int:
    script = Path(args[-1])
    text = script.read_text()
    with _locked():
        counter = _state() / "next_id"
        job_id = int(counter.read_text()) if counter.exists() else 1000
        counter.write_text(str(job_id + 1))
    (_state() / "scripts" / f"{job_id}.sh").write_text(text)
    array = re.search(r"^#SBATCH --array=(\d+)-(\d+)", text, re.M)
    keys = [f"{job_id}_{i}" for i in range(int(array[1]), int(array[2]) + 1)] if array else [str(job_id)]
    for key in keys:
        _update(key, state="PENDING", restarts=0)
        subprocess.Popen(
            [sys.executable, __file__, "_run", key, str(_state() / "scripts" / f"{job_id}.sh")],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    print(f"Submitted batch job {job_id}")
    return 0


def _job_env(key: str, script: str, attempt: int) -> dict:
    text = Path(script).read_text()
    main, _, index = key.partition("_")
    env = {
        **os.environ,
        "SLURM_JOB_ID": str(int(main) * 1000 + int(index or 0)) if index else main,
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_RESTART_COUNT": str(attempt),
        "FAKE_SLURM_JOB": key,
    }
    if index:
        env.update(SLURM_ARRAY_JOB_ID=main, SLURM_ARRAY_TASK_ID=index)
    cpus = re.search(r"^#SBATCH --cpus-per-task=(\d+)", text, re.M)
    if cpus:
        env["SLURM_CPUS_PER_TASK"] = cpus[1]
    return env


def _run(key: str, script: str) -> int:
    """One job, start to end (again after each requeue)."""
    attempt = 0
    while True:
        if read_job(key).get("cancelled"):
            _update(key, state="CANCELLED")
            return 0
        process = subprocess.Popen(["bash", script], env=_job_env(key, script, attempt), start_new_session=True)
        _update(key, state="RUNNING", batch_pid=process.pid)
        code = process.wait()
        job = read_job(key)
        if job.get("cancelled"):
            _update(key, state="CANCELLED", exit=code)
            return 0
        if job.get("requeue"):
            attempt += 1
            _update(key, state="REQUEUED", requeue=False, restarts=attempt)
            time.sleep(0.3)
            _update(key, state="PENDING")
            continue
        _update(key, state="COMPLETED" if code == 0 else "FAILED", exit=code)
        return 0


def srun(args: list[str]) -> int:
    """``srun --unbuffered --output OUT --error ERR COMMAND…``: the command with its output in those files."""
    outputs, rest = {}, list(args)
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        if option in ("--output", "--error"):
            outputs[option] = rest.pop(0)
    key, env = os.environ["FAKE_SLURM_JOB"], dict(os.environ)
    names = {
        "%A": env.get("SLURM_ARRAY_JOB_ID", env["SLURM_JOB_ID"]),
        "%a": env.get("SLURM_ARRAY_TASK_ID", ""),
        "%j": env["SLURM_JOB_ID"],
        "%t": "0",
    }
    for option, stream in (("--output", 1), ("--error", 2)):
        path = outputs.get(option)
        if path:
            for tag, value in names.items():
                path = path.replace(tag, value)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, stream)
    attempt = env["SLURM_RESTART_COUNT"]
    _write_atomically(_state() / "env" / f"{key}.{attempt}.json", json.dumps(env))
    _update(key, step_pid=os.getpid())
    os.execvp(rest[0], rest)
    return 1  # not reached


def sacct(args: list[str]) -> int:
    ids = [args[i + 1] for i, a in enumerate(args) if a == "-j"]
    print("JobID|State|NodeList")
    for job_id in ids:
        for key in _keys(job_id):
            print(f"{key}|{read_job(key).get('state', 'PENDING')}|localhost")
    return 0


def squeue(args: list[str]) -> int:
    print("JOBID STATE")
    for path in sorted((_state() / "jobs").glob("*.json")):
        state = json.loads(path.read_text()).get("state")
        if state in ("PENDING", "RUNNING", "REQUEUED"):
            print(f"{path.stem} {state}")
    return 0


def scancel(args: list[str]) -> int:
    sig, ids, rest = None, [], list(args)
    while rest:
        a = rest.pop(0)
        if a in ("--signal", "-s"):
            sig = rest.pop(0)
        elif a.startswith("--signal="):
            sig = a.split("=", 1)[1]
        else:
            ids.append(a)
    for job_id in ids:
        for key in _keys(job_id):
            job = read_job(key)
            if sig:  # to the task, as SLURM signals a job's steps
                name = sig if sig.startswith("SIG") else f"SIG{sig}"
                with contextlib.suppress(ProcessLookupError, KeyError):
                    os.kill(job["step_pid"], getattr(signal, name))
                continue
            _update(key, cancelled=True)
            if "batch_pid" in job and job.get("state") == "RUNNING":
                for s in (signal.SIGTERM, signal.SIGKILL):  # submitit's jobs ignore SIGTERM: SLURM kills after
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(job["batch_pid"], s)
                    time.sleep(0.5)
    return 0


def scontrol(args: list[str]) -> int:
    if args[:1] == ["requeue"]:
        for job_id in args[1:]:
            for key in _keys(job_id):
                _update(key, requeue=True)
        return 0
    if args[:2] == ["show", "hostnames"]:
        text = args[2] if len(args) > 2 else os.environ.get("SLURM_JOB_NODELIST", "")
        for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", text):
            group = re.fullmatch(r"(.*)\[(\d+)-(\d+)\]", part)
            if group:
                width = len(group[2])
                for n in range(int(group[2]), int(group[3]) + 1):
                    print(f"{group[1]}{n:0{width}d}")
            else:
                print(part)
        return 0
    print(f"scontrol: {' '.join(args)}: not faked", file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    command, args = argv[1], argv[2:]
    if command == "_run":
        return _run(*args)
    with _locked(), open(_state() / "calls.jsonl", "a") as log:
        log.write(json.dumps({"command": command, "args": args}) + "\n")
    return globals()[command](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
