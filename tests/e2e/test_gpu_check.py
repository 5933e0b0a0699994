"""The prepared GPU session's CPU rehearsal, through the script an operator runs on the GPU, from
what the device machine gets: a copy of the checkout's files, and a Python that has torch and the
other dependencies but not titanlite (and no pip: the machine is offline)."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT, check, clean_env


def _checkout_files() -> list[str]:
    """What travels to the device: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [f for f in out.split("\0") if f and (ROOT / f).is_file()]


def _python_without_titanlite(where: Path, hide: tuple[str, ...] = ()) -> Path:
    """A venv whose site-packages links to every entry of this Python's, except titanlite's
    editable install (its .pth finder and metadata), pip and the packages named in `hide`."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    ours = Path(sysconfig.get_paths()["purelib"])
    theirs = Path(
        subprocess.run(
            [
                str(where / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for entry in ours.iterdir():
        name = entry.name.lower()
        if "titanlite" in name or name.startswith(("pip", "__editable__", *hide)):
            continue
        (theirs / entry.name).symlink_to(entry)
    return where / "bin" / "python"


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """(checkout copy, its python, environment) for running the scripts as the device does."""
    base = tmp_path_factory.mktemp("bare")
    repo = base / "repo"
    for f in _checkout_files():
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, repo / f)
    python = _python_without_titanlite(base / "venv")
    env = clean_env(PYTHON=str(python), PYTHONNOUSERSITE="1", PIP_NO_INDEX="1")
    env.pop("PYTHONPATH", None)
    env["PATH"] = f"{python.parent}{os.pathsep}{env['PATH']}"
    # The isolation holds: outside the copy this Python cannot import titanlite.
    proc = subprocess.run(
        [str(python), "-c", "import titanlite"], cwd=base, env=env, capture_output=True
    )
    assert proc.returncode != 0, "titanlite is importable without the checkout"
    return repo, env


def _bench_gpu(bare, out: Path, *args: str) -> subprocess.CompletedProcess:
    repo, env = bare
    return subprocess.run(
        ["bash", "scripts/bench_gpu.sh", "--smoke", *args],
        cwd=repo,
        env={**env, "OUT": str(out)},
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
def test_gpu_check_smoke_runs_every_check(bare, tmp_path):
    # The per-run limit is raised: on a loaded 2-core machine (a)'s inductor compile, sharing the
    # cores with two other checks, has taken more than the default 300 s.
    proc = check(_bench_gpu(bare, tmp_path, "--checks-only", "--timeout", "600"))
    summary = json.loads((tmp_path / "gpu_check" / "gpu_check.json").read_text())
    status = {r["check"]: r["status"] for r in summary["results"]}
    assert summary["smoke"] and summary["device"] is None
    # Everything CPU can run passes; the CUDA-allocator checks say why they did not run.
    assert status == {**dict.fromkeys("abcdghijk", "PASS"), "e": "SKIPPED", "f": "SKIPPED"}, (
        summary["results"]
    )
    by_check = {r["check"]: r for r in summary["results"]}
    assert "needs the CUDA caching allocator" in by_check["e"]["figure"]
    assert "predicted" in by_check["f"]["figure"]  # the dry run itself ran and was parsed
    assert "fell back to 'async'" in by_check["c"]["name"]
    # Every parameter of the model is compared, and printed with its error.
    grads = by_check["a"]["per_parameter"]
    assert len(grads) == 21 and all(r["rel"] is not None and not r["lost"] for r in grads.values())
    assert "tok_embeddings.weight" in proc.stdout and "rel " in proc.stdout
    assert "'auto' (varlen)" in by_check["g"]["name"]  # the default kernel is the one compared
    assert "cp 2/4/8" in by_check["h"]["name"]
    assert "backend gloo, 21/21 parameters DTensors" in by_check["i"]["figure"]
    assert "varlen" in by_check["j"]["figure"] and "sdpa" in by_check["j"]["figure"]
    assert "14 saved as torchao weights" in by_check["k"]["figure"]
    # Each check's line, with its figure, comes as the check ends, before the summary table.
    table_at = proc.stdout.index("| check | status |")
    for r in summary["results"]:
        assert 0 <= proc.stdout.index(f"({r['check']}) {r['status']}") < table_at
    table = (tmp_path / "gpu_check" / "gpu_check.txt").read_text()
    assert table.count("| PASS |") == 9 and table.count("| SKIPPED |") == 2
    assert (tmp_path / "gpu_check" / "logs" / "c_resumed.log").exists()


@pytest.mark.slow
def test_bench_smoke_prints_each_variant(bare, tmp_path):
    proc = check(_bench_gpu(bare, tmp_path, "--bench-only", "--eager-only"))
    out = proc.stdout
    # Each float8 variant's figures, then each attention round's, as they come.
    variants = [
        json.loads(x.split(": ", 1)[1]) for x in out.splitlines() if x.startswith("bench_float8: {")
    ]
    assert [v["variant"] for v in variants] == ["bf16", "float8 tensorwise"]
    assert all(v["tps"] > 0 for v in variants), variants
    assert out.index("bench_float8: {") < out.index("bench_attention: round 1/2 tokens/s")
    assert "| varlen block_causal (auto) |" in (tmp_path / "bench_attention.md").read_text()
    assert "bench_gpu --bench-only:" in out and "exit 0" in out


def test_bench_gpu_needs_one_half(bare, tmp_path):
    proc = _bench_gpu(bare, tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "bench_gpu: give --checks-only or --bench-only (each fits 6 minutes on one H200: run "
        "them as two commands)"
    ]


def test_missing_dependency_is_one_line_and_a_carried_wheel_serves(bare, tmp_path):
    """The device machine may lack torchdata: bench_gpu says so in one line (exit 2); its wheel
    in .whl/ is unpacked onto the path, without pip."""
    repo, env = bare
    python = _python_without_titanlite(tmp_path / "venv", hide=("torchdata",))
    env = {**env, "PYTHON": str(python), "TMPDIR": str(tmp_path)}
    env["PATH"] = f"{python.parent}{os.pathsep}{env['PATH']}"
    # An unknown check stops gpu_check at its argument parsing, after the dependency check.
    cmd = ["bash", "scripts/bench_gpu.sh", "--smoke", "--checks-only", "--only", "zz"]
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"bench_gpu: torchdata not importable by {python}; put their wheels in .whl/ "
        "(docs/performance.md)"
    ]
    wheels = repo / ".whl"
    wheels.mkdir()
    source = Path(sysconfig.get_paths()["purelib"]) / "torchdata"
    with zipfile.ZipFile(wheels / "torchdata-0-py3-none-any.whl", "w") as whl:
        for f in source.rglob("*.py"):
            whl.write(f, f.relative_to(source.parent))
    try:
        proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(wheels)
    assert proc.stdout.startswith("torch "), proc.stderr  # the dependency check passed
    assert "--only: unknown ['zz']" in proc.stderr
