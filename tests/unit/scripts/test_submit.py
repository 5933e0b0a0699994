"""scripts/submit.py without a cluster: the #SBATCH lines it writes, and a config mistake
stopping it before anything is submitted."""

import subprocess
import sys

from helpers import ROOT, clean_env

sys.path.insert(0, str(ROOT / "scripts"))
from submit import TEMPLATE, sbatch_script  # noqa: E402


def sbatch_lines(text: str) -> list[str]:
    return [ln.split("#")[1].strip() for ln in text.splitlines() if ln.startswith("#SBATCH")]


def test_sbatch_lines_follow_the_arguments():
    gpu = sbatch_lines(
        sbatch_script(
            TEMPLATE.read_text(),
            nodes=4,
            ngpu=8,
            partition="train",
            time_limit="2:00:00",
            account="acc",
            job_name="l8b",
            log="logs/%x-%j.out",
        )
    )
    for want in (
        "SBATCH --nodes=4",
        "SBATCH --gres=gpu:8",
        "SBATCH --partition=train",
        "SBATCH --account=acc",
        "SBATCH --time=2:00:00",
        "SBATCH --job-name=l8b",
        "SBATCH --signal=USR1@120",
        "SBATCH --requeue",
    ):
        assert want in gpu, (want, gpu)
    cpu = sbatch_lines(
        sbatch_script(
            TEMPLATE.read_text(),
            nodes=2,
            ngpu=0,
            partition=None,
            time_limit="10",
            account=None,
            job_name="t",
            log="x",
        )
    )
    assert not [
        ln
        for ln in cpu
        if "gres" in ln or "partition" in ln or "account" in ln or "cpus-per-task" in ln
    ], cpu


def test_config_mistake_is_one_line_and_nothing_is_submitted():
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/submit.py",
            "--config",
            "debug_model.toml",
            "--nodes",
            "2",
            "--ngpu",
            "0",
            "--training.stepz",
            "3",
        ],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("titanlite: error:") and "stepz" in proc.stderr
    assert "Traceback" not in proc.stderr
