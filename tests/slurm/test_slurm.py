"""The real scripts/multinode_trainer.slurm on a real SLURM (scripts/local_slurm.sh: slurmctld and
two slurmd emulating node1 and node2 on this machine), and multi-node rendezvous without SLURM."""

import shutil
import subprocess
import sys
import time

import pytest
from helpers import ROOT, SHORT_RUN, SHORT_RUN_STEPS, check, clean_env, free_port, losses_by_step

from titanlite.components.checkpoint.folder import complete_steps
from titanlite.components.checkpoint.storage import verify

LOCAL_SLURM = ROOT / "scripts" / "local_slurm.sh"
# The script's #SBATCH lines are for a GPU cluster; these make it fit the emulated CPU nodes.
CPU_NODES = ["--nodes=2", "--gres=none", "--partition=debug", "--cpus-per-task=1", "--time=10"]


def slurm_missing() -> str | None:
    if shutil.which("sbatch") and shutil.which("slurmctld"):
        return None
    return (
        "SLURM is not installed (.ci/run installs it with `scripts/local_slurm.sh install`, "
        "which needs root and apt-get)"
    )


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if reason := slurm_missing():
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("slurm")
    try:
        started = subprocess.run(
            ["bash", str(LOCAL_SLURM), "start", "--nodes", "2", "--dir", str(folder)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert started.returncode == 0, started.stderr[-3000:]
        env = clean_env(
            SLURM_CONF=str(folder / "slurm.conf"),
            NGPU="1",
            PYTHON=sys.executable,
            MAX_RESTARTS="0",
            RDZV_PORT=str(free_port()),
        )
        yield env
    finally:
        subprocess.run(
            ["bash", str(LOCAL_SLURM), "stop", "--dir", str(folder)],
            capture_output=True,
            timeout=120,
        )


def sbatch(env, log, *args: str, wait: bool = True) -> subprocess.Popen:
    cmd = [
        "sbatch",
        "--parsable",
        *(["--wait"] if wait else []),
        *CPU_NODES,
        f"--output={log}",
        str(ROOT / "scripts" / "multinode_trainer.slurm"),
        *SHORT_RUN,
        *args,
    ]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def job_field(env, job: str, key: str) -> str | None:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job], env=env, capture_output=True, text=True
    ).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith(f"{key}=")), None)


@pytest.mark.slow
def test_sbatch_two_nodes_trains_like_one_node(slurm, two_rank_reference, tmp_path):
    log = tmp_path / "job.out"
    proc = sbatch(slurm, log, "--job.dump_folder", str(tmp_path), "--checkpoint.interval", "100")
    out, err = proc.communicate(timeout=400)
    text = log.read_text() if log.exists() else ""
    assert proc.returncode == 0, f"{err}\n{text[-5000:]}"
    assert "on 2 node(s): node1 node2 x 1 rank(s)" in text
    assert "[rank0]" in text and "[rank1]" in text, text[-3000:]  # one rank on each node
    got = losses_by_step(tmp_path)
    assert sorted(got) == list(range(1, SHORT_RUN_STEPS + 1))
    assert all(got[s] == two_rank_reference[s] for s in got), (got, two_rank_reference)
    assert complete_steps(tmp_path / "checkpoint") == [SHORT_RUN_STEPS]


@pytest.mark.slow
def test_sbatch_pipeline_stages_on_two_nodes(slurm, two_rank_reference, tmp_path):
    """The script and launcher unchanged, PP 2 with one stage per node: the same global batch
    (8 sequences) as the 2-rank FSDP reference, so the same losses within 1e-4."""
    log = tmp_path / "job.out"
    proc = sbatch(
        slurm,
        log,
        "--job.dump_folder",
        str(tmp_path),
        "--checkpoint.interval",
        "100",
        "--parallelism.pipeline_parallel_degree",
        "2",
        "--training.local_batch_size",
        "8",
    )
    out, err = proc.communicate(timeout=400)
    text = log.read_text() if log.exists() else ""
    assert proc.returncode == 0, f"{err}\n{text[-5000:]}"
    assert "mesh pp=2 (world 2)" in text and "on 2 node(s): node1 node2" in text
    got = losses_by_step(tmp_path)
    assert sorted(got) == list(range(1, SHORT_RUN_STEPS + 1))
    for s, loss in got.items():
        assert abs(loss - two_rank_reference[s]) <= 1e-4 * loss, (s, loss, two_rank_reference[s])


@pytest.mark.slow
def test_sigusr1_checkpoints_requeues_and_resumes(slurm, two_rank_reference, tmp_path):
    log = tmp_path / "job.out"
    proc = sbatch(slurm, log, "--job.dump_folder", str(tmp_path), "--checkpoint.interval", "4")
    try:
        deadline = time.time() + 300
        job = None
        while job is None or not complete_steps(tmp_path / "checkpoint"):
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            job = job or (proc.stdout.readline().strip() or None)
            time.sleep(0.1)
        # What `#SBATCH --signal=USR1@120` does before the time limit, now.
        subprocess.run(["scancel", "--signal=USR1", job], env=slurm, check=True)
        # SLURM holds a requeued job for ~2 minutes (BeginTime); release it at once.
        while (
            job_field(slurm, job, "Restarts") in (None, "0")
            or job_field(slurm, job, "JobState") != "PENDING"
        ):
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        subprocess.run(
            ["scontrol", "update", f"JobId={job}", "StartTime=now"], env=slurm, check=True
        )
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert proc.returncode == 0, f"{err}\n{text[-5000:]}"
    stopped = [ln for ln in text.splitlines() if "SIGUSR1: stopped after step" in ln]
    assert stopped, text[-5000:]
    step = int(stopped[0].split("after step ")[1].split(";")[0])
    assert "requeueing SLURM job" in text and "resumes from the checkpoint when" in text
    assert "(restart 1)" in text and f"resuming at step {step}" in text
    for s in complete_steps(tmp_path / "checkpoint"):
        assert verify(tmp_path / "checkpoint" / f"step-{s}") == []
    got = losses_by_step(tmp_path)
    assert sorted(got) == list(range(1, SHORT_RUN_STEPS + 1))
    assert got[SHORT_RUN_STEPS] == two_rank_reference[SHORT_RUN_STEPS]
    assert all(got[s] == two_rank_reference[s] for s in got)


@pytest.mark.slow
def test_two_torchrun_nodes_rendezvous_without_slurm(two_rank_reference, tmp_path):
    port = free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node_rank={rank}",
                "--nproc_per_node=1",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                "-m",
                "titanlite.train",
                *SHORT_RUN,
                "--job.dump_folder",
                str(tmp_path),
                "--checkpoint.interval",
                "100",
            ],
            cwd=ROOT,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    for r in results:
        check(r)
    assert "[rank1]" in results[1].stderr  # node 1's process is global rank 1
    got = losses_by_step(tmp_path)
    assert all(got[s] == two_rank_reference[s] for s in range(1, SHORT_RUN_STEPS + 1))
