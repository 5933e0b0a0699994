"""scripts/mutants.py keeps up with the code without running a mutant (that takes ~11 minutes
and runs before each release): every mutant still finds the one place it edits, its edit leaves
valid Python, and every test it names exists."""

import subprocess
import sys

import pytest
from helpers import ROOT, clean_env

sys.path.insert(0, str(ROOT / "scripts"))
from mutants import MUTANTS, Mutant  # noqa: E402


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_each_mutant_applies_once_and_compiles(tmp_path, mutant):
    target = tmp_path / mutant.path
    target.parent.mkdir(parents=True, exist_ok=True)  # a file at the top: tmp_path itself
    target.write_text((ROOT / mutant.path).read_text())
    mutant.apply(tmp_path)
    mutated = target.read_text()
    assert mutated != (ROOT / mutant.path).read_text()
    if target.suffix == ".py":
        compile(mutated, str(target), "exec")


def test_a_mutant_that_no_longer_matches_the_code_is_an_error(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\nx = 1\n")
    for old in ("x = 1\n", "y = 2\n"):  # twice, then never
        with pytest.raises(ValueError, match="update the mutant"):
            Mutant("m", "bug", "a.py", old, "x = 2\n", ()).apply(tmp_path)


def test_every_guarding_test_exists():
    ids = sorted({t for m in MUTANTS for t in m.tests})
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *ids],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    collected = {line.split("[")[0] for line in proc.stdout.splitlines() if "::" in line}
    assert {t.split("[")[0] for t in ids} <= collected
