"""run_train.sh and the SLURM script turn on the CUDA allocator's expandable segments for the
ranks unless the user chose an allocator setting. The launchers are stood in for by a PYTHON
(and srun) that report the variables the ranks would inherit, so no training runs here."""

import os
import stat
import subprocess
import sys

import pytest
from helpers import DEBUG_CONFIG, ROOT, clean_env

NAMES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


REPORT = 'echo "ALLOC=${PYTORCH_ALLOC_CONF-unset} CUDA=${PYTORCH_CUDA_ALLOC_CONF-unset}"'


def _script(path, body: str):
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _launch_env(tmp_path, launcher: str, **env: str) -> str:
    """What the ranks' launcher is started with: run_train.sh's torchrun, or the SLURM
    script's srun (scontrol and srun stood in for too)."""
    _script(
        tmp_path / "python",
        f'case "$*" in *"-m titanlite.launch"*) {REPORT}; exit 0 ;;\n'
        '*"-m titanlite.preflight"*) exit 0 ;;\n'
        f'esac\nexec {sys.executable} "$@"\n',
    )
    _script(tmp_path / "srun", f"{REPORT}\n")
    _script(
        tmp_path / "scontrol",
        'if [[ $2 == node ]]; then echo "NodeAddr=127.0.0.1"; else echo n1; fi\n',
    )
    base = {k: v for k, v in clean_env().items() if k not in NAMES}
    slurm = {"SLURM_JOB_NODELIST": "n1", "SLURM_NNODES": "1", "SLURM_JOB_ID": "7"}
    proc = subprocess.run(
        ["bash", launcher, "--config", str(DEBUG_CONFIG)],
        cwd=ROOT,
        env={
            **base,
            **slurm,
            "PATH": f"{tmp_path}:{base['PATH']}",
            "PYTHON": str(tmp_path / "python"),
            "NGPU": "1",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "env, seen",
    [
        ({}, "ALLOC=expandable_segments:True CUDA=unset"),
        ({"PYTORCH_ALLOC_CONF": "max_split_size_mb:256"}, "ALLOC=max_split_size_mb:256 CUDA=unset"),
        # The legacy name is still read by torch 2.13 (first, by its CUDA allocator): a user's
        # setting there must not be joined by a second one under the new name.
        (
            {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"},
            "ALLOC=unset CUDA=expandable_segments:False",
        ),
        ({"PYTORCH_ALLOC_CONF": ""}, "ALLOC= CUDA=unset"),  # set empty on purpose: kept
    ],
)
def test_run_train_sh_turns_on_expandable_segments_unless_the_user_chose(tmp_path, env, seen):
    assert _launch_env(tmp_path, "run_train.sh", **env) == seen


@pytest.mark.parametrize(
    "env, seen",
    [
        ({}, "ALLOC=expandable_segments:True CUDA=unset"),
        ({"PYTORCH_CUDA_ALLOC_CONF": "x:1"}, "ALLOC=unset CUDA=x:1"),
    ],
)
def test_the_slurm_script_does_the_same(tmp_path, env, seen):
    assert _launch_env(tmp_path, "scripts/multinode_trainer.slurm", **env) == seen


def test_torch_reads_both_names():
    # The names run_train.sh checks are the ones torch 2.13's allocator configuration reads.
    import torch

    header = os.path.join(os.path.dirname(torch.__file__), "include/c10/cuda/CUDAAllocatorConfig.h")
    text = open(header).read()
    assert all(f'get_env("{name}")' in text for name in NAMES)
