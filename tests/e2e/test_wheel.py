"""An installed wheel, not a checkout: `--config llama_8b.toml` finds the preset installed with
the package (train_configs/ as titanlite/presets/), and a dry run plans from it."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, clean_env

SOURCES = ["pyproject.toml", "README.md", "titanlite", "models", "parallelisms", "train_configs"]


@pytest.mark.timeout(300)
def test_wheel_finds_presets_outside_a_checkout(tmp_path):
    pytest.importorskip("setuptools")
    # A copy of the sources: pip builds in the tree, and its build/ and *.egg-info must not land
    # in the checkout (other runs may be building from it at the same time).
    src = tmp_path / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, src / name)
    env = {k: v for k, v in clean_env().items() if k != "PYTHONPATH"}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"

    def run(*cmd, cwd: Path = tmp_path) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
        )
        assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc

    wheels = tmp_path / "wheels"
    pip = ["-m", "pip", "--no-input"]
    run(sys.executable, *pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index",
        "-q", "-w", wheels, src)  # fmt: skip
    (wheel,) = wheels.glob("titanlite-*.whl")
    # The system site-packages give torch and the other dependencies without a download; the
    # wheel's own titanlite comes first on the venv's path. --ignore-installed: pip leaves alone
    # any titanlite installed outside the venv (an editable checkout).
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", venv)
    python = venv / "bin" / "python"
    run(python, *pip, "install", "--no-deps", "--no-index", "--ignore-installed", "-q", wheel)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    site = run(
        python,
        "-c",
        "import titanlite; from titanlite.config.loader import load; "
        "print(titanlite.__file__); print(load(['--config', 'llama_8b.toml']).job.config_file)",
        cwd=elsewhere,
    ).stdout.split()
    installed = Path(site[0]).resolve().parent
    assert installed.is_relative_to(venv.resolve()), f"titanlite imported from {installed}"
    assert Path(site[1]).resolve() == installed / "presets" / "llama_8b.toml"
    assert not Path(site[1]).resolve().is_relative_to(ROOT)

    plan = run(
        python, "-m", "titanlite.dry_run", "--config", "llama_8b.toml", "--dry-run.world_size",
        "8", cwd=elsewhere,
    )  # fmt: skip
    assert "llama3 8B, 8.03B parameters, world 8" in plan.stdout, plan.stdout + plan.stderr
