"""Where a command's jobs run: the ``launcher:`` section of a sweep or reproduction file, and the ``--launcher`` /
``--slurm KEY=VALUE`` options that choose and override it.

::

    launcher:
      kind: slurm              # the default of --launcher (local when absent)
      partition: gpu
      time: "4:00:00"          # per job: minutes, or SLURM's forms (MM:SS, H:MM:SS, D-H, D-H:MM, D-H:MM:SS)
      cpus_per_task: 8
      gpus_per_job: 1
      mem_gb: 32
      account: my-lab
      sbatch: {qos: normal, constraint: a100}   # any other sbatch option, by its long name
      setup: ["module load cuda/12.4", "source .venv/bin/activate"]
      max_requeues: 3          # preemptions and time-outs retried per job, at most

``--slurm partition=long --slurm time=2-00:00:00`` sets the same fields from the command line (values read as
YAML, ``sbatch.<option>=…`` one extra option, each ``setup=…`` one command; given ones replace the file's). A bad
value is one line naming ``launcher.<field>`` or ``--slurm <field>``, exit 2 (:class:`LauncherError`).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from harness.config import Strict, yaml_errors
from harness.config.yaml_io import safe_load

CLUSTER_EXTRA = 'pip install -e ".[cluster]"'
_TIME = re.compile(r"^(?:(?P<d>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$")
# sbatch options the launcher writes itself: given under sbatch they would fight its own (or have a field).
_OWN_OPTIONS = {
    "array": "the launcher makes one job per task",
    "output": "the launcher writes each job's log beside its jobs file",
    "error": "the launcher writes each job's log beside its jobs file",
    "job-name": "the command names its jobs",
    "signal": "submitit asks for USR2 before the time limit, to requeue",
    "open-mode": "logs are appended across requeues",
    "partition": "give launcher.partition",
    "time": "give launcher.time",
    "cpus-per-task": "give launcher.cpus_per_task",
    "gpus-per-node": "give launcher.gpus_per_job",
    "mem": "give launcher.mem_gb",
    "account": "give launcher.account",
}


class LauncherError(ValueError):
    """A launcher setting that cannot be used, or a launcher that cannot start here; the message is one line."""


def slurm_minutes(value: Any) -> int:
    """A SLURM time limit in whole minutes (at least 1): ``90``, ``"90"``, ``"MM:SS"``, ``"H:MM:SS"``, ``"D-H"``,
    ``"D-H:MM"``, ``"D-H:MM:SS"`` (sbatch's forms)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a time limit")
    if isinstance(value, (int, float)):
        if value < 1:
            raise ValueError(f"{value!r} minutes: a time limit is at least 1 minute")
        return int(value)
    match = _TIME.match(str(value).strip())
    if not match:
        raise ValueError(f"{value!r} is not a time limit: give minutes, H:MM:SS or D-HH:MM:SS")
    days, a, b, c = (int(match[k]) if match[k] is not None else None for k in ("d", "a", "b", "c"))
    if days is None:  # minutes | minutes:seconds | hours:minutes:seconds
        seconds = a * 60 + (b or 0) if c is None else a * 3600 + b * 60 + c
    else:  # days-hours[:minutes[:seconds]]
        seconds = days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    return max(1, -(-seconds // 60))  # rounded up: never less time than asked


class LauncherSpec(Strict):
    """Where the jobs of ``harness sweep``, ``harness repro`` and seed groups run, and what each SLURM job asks for
    (ignored by the local launcher)."""

    kind: Literal["local", "slurm"] = Field("local", description="The default of --launcher.")
    partition: str | None = Field(None, description="sbatch --partition.")
    time: int = Field(240, description="Time limit per job in minutes (also H:MM:SS, D-HH:MM:SS); sbatch --time.")
    cpus_per_task: int | None = Field(None, ge=1, description="sbatch --cpus-per-task (the job's torch threads).")
    gpus_per_job: int | None = Field(None, ge=0, description="GPUs per job: sbatch --gpus-per-node.")
    mem_gb: float | None = Field(None, gt=0, description="Memory per job in GB: sbatch --mem.")
    account: str | None = Field(None, description="sbatch --account.")
    sbatch: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="Other sbatch options by long name: {qos: normal, constraint: a100}."
    )
    setup: list[str] = Field(default_factory=list, description="Shell commands each job runs first.")
    max_requeues: int = Field(3, ge=0, description="Times a job preempted or timed out is requeued, at most.")
    array_parallelism: int | None = Field(None, ge=1, description="Jobs of the array running at once, at most.")
    poll: float = Field(30.0, gt=0, description="Seconds between the launching command's looks at its jobs.")

    @field_validator("time", mode="before")
    @classmethod
    def _minutes(cls, value: Any) -> int:
        return slurm_minutes(value)

    @field_validator("sbatch")
    @classmethod
    def _extra_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        for key in options:
            name = key.replace("_", "-")
            if not re.fullmatch(r"[a-z][a-z0-9-]*", name):
                raise ValueError(f"{key!r} is not an sbatch option's long name (e.g. qos, constraint)")
            if name in _OWN_OPTIONS:
                raise ValueError(f"{key!r} is set by the launcher: {_OWN_OPTIONS[name]}")
        return options

    def submitit_parameters(self, name: str) -> dict[str, Any]:
        """The parameters of a ``submitit.AutoExecutor`` for these jobs (``slurm_*`` ones apply on SLURM only).
        ``--requeue``: SLURM may requeue a job whose node failed, and submitit requeues one it was asked to stop."""
        params: dict[str, Any] = {
            "name": name,
            "timeout_min": self.time,
            "slurm_additional_parameters": {"requeue": True, **self.sbatch},
        }
        optional = {
            "cpus_per_task": self.cpus_per_task,
            "gpus_per_node": self.gpus_per_job,
            "mem_gb": self.mem_gb,
            "slurm_partition": self.partition,
            "slurm_account": self.account,
            "slurm_setup": list(self.setup) or None,
            "slurm_array_parallelism": self.array_parallelism,
        }
        params.update({k: v for k, v in optional.items() if v is not None})
        return params


def _cli_fields(items: list[str]) -> dict[str, Any]:
    """``--slurm KEY=VALUE`` items as a partial section: values read as YAML, ``sbatch.<option>`` nested, every
    ``setup`` item one command."""
    fields: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise LauncherError(f"--slurm {item!r}: give KEY=VALUE (e.g. --slurm partition=gpu)")
        if key == "setup":  # a shell command: kept as written, not read as YAML
            fields.setdefault("setup", []).append(text)
            continue
        value = safe_load(text) if text.strip() else None
        head, dot, option = key.partition(".")
        if head == "sbatch" and dot:
            fields.setdefault("sbatch", {})[option] = value
        else:
            fields[key] = value
    return fields


def resolve_launcher(section: LauncherSpec | None, kind: str | None, items: list[str] | None) -> LauncherSpec:
    """The launcher a command uses: the file's ``launcher:`` section (or the defaults), ``--slurm`` items over it,
    ``--launcher`` over its kind. Raises :class:`LauncherError` (one line) for a bad item, for SLURM settings given
    to the local launcher, and for ``slurm`` without submitit installed."""
    items = list(items or [])
    cli = _cli_fields(items)
    merged = {**(section.model_dump(exclude_unset=True) if section else {}), **cli}
    if "sbatch" in cli and section is not None:
        merged["sbatch"] = {**section.sbatch, **cli["sbatch"]}
    if kind is not None:
        merged["kind"] = kind
    try:
        spec = LauncherSpec.model_validate(merged)
    except ValidationError as e:
        errors = yaml_errors(e, LauncherSpec)
        said = [f"{'--slurm ' if path.split('.')[0] in cli else 'launcher.'}{path}: {msg}" for path, msg in errors]
        raise LauncherError("; ".join(said)) from None
    if spec.kind == "local" and items:
        raise LauncherError("--slurm settings apply to --launcher slurm (this command would run on this machine)")
    if spec.kind == "slurm":
        require_submitit()
    return spec


def require_submitit() -> None:
    """submitit, the optional ``cluster`` extra, is importable; else one line saying how to install it."""
    try:
        import submitit  # noqa: F401 — only its presence is checked here
    except ImportError:
        raise LauncherError(f"--launcher slurm needs submitit, the harness's cluster extra: {CLUSTER_EXTRA}") from None
