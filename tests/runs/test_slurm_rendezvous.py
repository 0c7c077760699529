"""``harness run … --nproc N --nodes M`` inside a SLURM allocation: torchrun's multi-node rendezvous read from SLURM's
environment (the first host of ``scontrol show hostnames $SLURM_JOB_NODELIST``, ``$SLURM_JOB_ID`` as the rendezvous
id, ``$SLURM_NODEID``), and one line outside one (exit 2)."""

from __future__ import annotations

import os

import pytest

from harness.runs.execution.process_ranks import RendezvousError, torchrun_command
from tests.conftest import invoke, write_yaml
from tests.studies import fake_slurm


def test_the_rendezvous_comes_from_slurms_environment(tmp_path, monkeypatch):
    fake_slurm.install(tmp_path / "bin", tmp_path / "state")  # scontrol show hostnames expands the node list
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_DIR", str(tmp_path / "state"))
    for key, value in {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NODEID": "1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    command = torchrun_command(8, ["run", "x.yaml", "--nproc", "8", "--nodes=2", "--out", "/shared/qs"], nodes=2)
    assert command[3:] == [
        "--nnodes=2",
        "--node-rank=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=gpu07:29500",
        "--rdzv-id=4242",
        "--nproc-per-node=8",
        "-m",
        "harness",
        "run",
        "x.yaml",
        "--out",
        "/shared/qs",
    ]
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "3")
    with pytest.raises(RendezvousError, match="--nodes 2, but this SLURM allocation has 3 node"):
        torchrun_command(8, [], nodes=2)
    assert "--standalone" in torchrun_command(2, [], nodes=1)  # one node: torchrun's own rendezvous


def test_nodes_outside_slurm_is_one_line(tmp_path, tiny, monkeypatch):
    for key in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(key, raising=False)
    path = write_yaml(tmp_path / "tiny.yaml", tiny)
    result = invoke("run", str(path), "--nodes", "2", "--out", str(tmp_path / "run"))
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("--nodes 2: the rendezvous is read from SLURM's environment")
