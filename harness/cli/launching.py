"""The options every command that launches many runs shares (``harness sweep``, ``harness repro``, ``harness run
--seeds``): ``--launcher local|slurm``, ``--slurm KEY=VALUE`` and ``--detach``, and the one line a bad choice ends
with (exit 2). What they mean: :mod:`harness.studies.launch`."""

from __future__ import annotations

import typer

LauncherOption = typer.Option(
    None,
    "--launcher",
    help="Where the jobs run: local (this machine) or slurm (one job array; needs the cluster extra). "
    "Default: the file's launcher.kind, else local.",
)
SlurmOption = typer.Option(
    None,
    "--slurm",
    help="A SLURM setting, repeatable, over the file's launcher: section: partition=gpu, time=4:00:00, "
    "cpus_per_task=8, gpus_per_job=1, mem_gb=32, account=lab, sbatch.qos=high, setup='module load cuda', "
    "max_requeues=3, poll=30.",
)
DetachOption = typer.Option(
    False, "--detach", help="With --launcher slurm: submit, then return; the same command again re-attaches."
)


def choose_launcher(section, kind: str | None, items: list[str] | None):
    """The resolved :class:`~harness.studies.launch.LauncherSpec`; exit 2 with one line when it cannot be used."""
    from harness.studies.launch import LauncherError, resolve_launcher

    if kind is not None and kind not in ("local", "slurm"):
        raise_usage(f"--launcher {kind!r}: use local or slurm")
    try:
        return resolve_launcher(section, kind, items)
    except LauncherError as e:
        raise_usage(str(e))


def raise_usage(message: str, code: int = 2) -> None:
    typer.echo(message, err=True)
    raise typer.Exit(code)
