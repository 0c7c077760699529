"""The launcher's settings and refusals, before anything is submitted: the ``launcher:`` section validated like every
section (errors by YAML path), ``--slurm KEY=VALUE`` over it (one line, exit 2), SLURM time limits, the missing
cluster extra, a journal-file storage under ``--launcher slurm``, and options that do not go together."""

from __future__ import annotations

import sys

import pytest

from harness.config import ConfigError
from harness.studies.launch import LauncherError, LauncherSpec, resolve_launcher
from harness.studies.launch.run_job import RunJob
from harness.studies.launch.spec import slurm_minutes
from harness.studies.sweep import load_sweep
from tests.conftest import invoke, write_yaml
from tests.studies.test_sweep import _sweep


@pytest.mark.parametrize(
    "given, minutes",
    [(90, 90), ("90", 90), ("90:30", 91), ("1:30:00", 90), ("2-00:00:00", 2880), ("1-12", 2160), ("0-0:0:20", 1)],
)
def test_slurm_time_limits_in_minutes(given, minutes):
    assert slurm_minutes(given) == minutes


def test_the_launcher_section_names_its_paths(tmp_path):
    path = _sweep(
        tmp_path, "bad", launcher={"kind": "slurm", "time": "soon", "partiton": "gpu", "sbatch": {"array": 3}}
    )
    with pytest.raises(ConfigError) as e:
        load_sweep(path)
    errors = dict(e.value.errors)
    assert "'soon' is not a time limit" in errors["launcher.time"]
    assert "unknown key 'partiton' (did you mean 'partition'?)" in errors["launcher.partiton"]
    assert "'array' is set by the launcher" in errors["launcher.sbatch"]
    spec = load_sweep(_sweep(tmp_path, "good", launcher={"partition": "gpu", "time": "4:00:00"})).spec.launcher
    assert (spec.kind, spec.partition, spec.time) == ("local", "gpu", 240)


def test_slurm_items_override_the_file_in_one_line():
    pytest.importorskip("submitit")
    section = LauncherSpec(partition="gpu", sbatch={"qos": "low"}, setup=["module load a"])
    spec = resolve_launcher(
        section, "slurm", ["time=2-00:00:00", "sbatch.constraint=a100", "setup=source x", "mem_gb=8"]
    )
    assert (spec.partition, spec.time, spec.mem_gb) == ("gpu", 2880, 8)
    assert spec.sbatch == {"qos": "low", "constraint": "a100"} and spec.setup == ["source x"]
    with pytest.raises(LauncherError) as e:
        resolve_launcher(section, "slurm", ["time=abc", "cpus_per_task=0"])
    assert str(e.value) == (
        "--slurm time: 'abc' is not a time limit: give minutes, H:MM:SS or D-HH:MM:SS; "
        "--slurm cpus_per_task: Input should be greater than or equal to 1"
    )
    with pytest.raises(LauncherError, match="apply to --launcher slurm"):
        resolve_launcher(None, None, ["partition=gpu"])  # SLURM settings, but the run would stay here


def test_without_submitit_slurm_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "submitit", None)  # import submitit now fails
    result = invoke("sweep", str(_sweep(tmp_path, "x")), "--launcher", "slurm", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        '--launcher slurm needs submitit, the harness\'s cluster extra: pip install -e ".[cluster]"'
    )


def test_a_journal_storage_is_refused_for_slurm_workers(tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    monkeypatch.delenv("HARNESS_STORAGE", raising=False)
    out = tmp_path / "out"
    result = invoke("sweep", str(_sweep(tmp_path, "j")), "--launcher", "slurm", "--out", str(out))
    assert result.exit_code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("--launcher slurm needs the study on PostgreSQL, not a journal file (")
    assert "trial budget's lock across machines is PostgreSQL's" in line
    assert not (out / "journal.log").exists()  # refused before the study was made


def test_options_that_do_not_go_together_are_refused(tmp_path, tiny):
    pytest.importorskip("submitit")
    sweep, exp = _sweep(tmp_path, "o"), write_yaml(tmp_path / "e.yaml", tiny)
    cases = [
        (["sweep", str(sweep), "--launcher", "slurm", "--gpus", "0,1"], "--gpus deals this machine's devices"),
        (["sweep", str(sweep), "--detach"], "--detach leaves SLURM jobs running"),
        (["sweep", str(sweep), "--launcher", "pbs"], "--launcher 'pbs': use local or slurm"),
        (["repro", "reversed_addition", "--launcher", "slurm", "--jobs", "2"], "--jobs is for this machine"),
        (["run", str(exp), "--launcher", "slurm"], "--launcher slurm runs seed replicates as jobs: give --seeds"),
        (["run", str(exp), "--seeds", "0,1", "--launcher", "slurm", "--jobs", "2"], "--jobs is for this machine"),
        (["run", str(exp), "--nproc", "2", "--nodes", "2"], "--nodes: give --out"),
    ]
    for args, message in cases:
        result = invoke(*args)
        assert result.exit_code == 2 and message in result.stderr, (args, result.output)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_run_job_requeues_as_a_resume_at_most_max_requeues_times(monkeypatch):
    pytest.importorskip("submitit")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    job = RunJob(max_requeues=2)
    first = job.checkpoint("exp", "dir", force=True)
    assert first.function is job and first.args == ("exp", "dir") and first.kwargs == {"force": True, "resume": True}
    assert job.checkpoint("exp", "dir") is not None and job.checkpoint("exp", "dir") is None  # the third: not
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")  # SLURM requeued it by itself beyond the bound
    with pytest.raises(RuntimeError, match="more than max_requeues"):
        RunJob(max_requeues=2)("exp", "dir")
