"""run_train.sh turns on the CUDA allocator's expandable segments for the ranks unless the user
chose an allocator setting. The ranks are stood in for by a PYTHON that reports the variables
torchrun would hand them (the launch and its preflight), so no training runs here."""

import os
import stat
import subprocess
import sys

import pytest
from helpers import DEBUG_CONFIG, ROOT, clean_env

NAMES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def _launch_env(tmp_path, **env: str) -> str:
    python = tmp_path / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        'case "$*" in *"-m titanlite.launch"*)\n'
        '    echo "ALLOC=${PYTORCH_ALLOC_CONF-unset} CUDA=${PYTORCH_CUDA_ALLOC_CONF-unset}"\n'
        "    exit 0 ;;\n"
        '*"-m titanlite.preflight"*) exit 0 ;;\n'
        "esac\n"
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    base = {k: v for k, v in clean_env().items() if k not in NAMES}
    proc = subprocess.run(
        ["bash", "run_train.sh", "--config", str(DEBUG_CONFIG)],
        cwd=ROOT,
        env={**base, "PYTHON": str(python), "NGPU": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


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
    assert _launch_env(tmp_path, **env) == seen


def test_torch_reads_both_names():
    # The names run_train.sh checks are the ones torch 2.13's allocator configuration reads.
    import torch

    header = os.path.join(os.path.dirname(torch.__file__), "include/c10/cuda/CUDAAllocatorConfig.h")
    text = open(header).read()
    assert all(f'get_env("{name}")' in text for name in NAMES)
