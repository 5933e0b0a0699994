"""Bounded numbers (titanlite.core.numbers, .arguments): every script's numeric argument is one,
and a mistake in any of them is one line and exit 2 (issue 46, items 4 and 6)."""

import ast
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import ROOT, clean_env

from titanlite.core.arguments import ArgumentParser, float_arg, int_arg
from titanlite.core.numbers import NumberError, read_float, read_int

# Python files of the product that parse a command line (the bundled corpus is data, not code).
SOURCES = [
    p
    for folder in ("titanlite", "scripts", "models", "parallelisms")
    for p in sorted((ROOT / folder).rglob("*.py"))
    if "assets" not in p.parts and p != ROOT / "titanlite" / "core" / "arguments.py"
]


def _bare_number_arguments(path) -> list[str]:
    """`type=int` / `type=float` (a bare int() takes 10**30 and -1, float() nan) and argparse's
    own parser (a usage block before the error line), where `path` builds a command line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.keyword) and node.arg == "type":
            if isinstance(node.value, ast.Name) and node.value.id in ("int", "float"):
                found.append(f"{path.relative_to(ROOT)}:{node.value.lineno} type={node.value.id}")
        if isinstance(node, ast.Attribute) and node.attr == "ArgumentParser":
            if isinstance(node.value, ast.Name) and node.value.id == "argparse":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} argparse.ArgumentParser")
    return found


def test_no_script_reads_a_number_without_bounds():
    assert len(SOURCES) > 100
    found = [hit for p in SOURCES for hit in _bare_number_arguments(p)]
    assert not found, "\n".join(found)


def test_readers_refuse_what_is_not_a_number_in_range():
    assert read_int("0x10", "n", 1, 16) == 16 and read_int("1_000", "n", 1, 1000) == 1000
    assert read_float("2.5", "f", 0, 3) == 2.5
    for call, says in [
        (lambda: read_int("1e3", "n", 1, 10), "n = '1e3': expected an integer"),
        (lambda: read_int(True, "n", 0, 10), "expected an integer"),
        (lambda: read_int(10**30, "n", 1, 10), f"n = {10**30}: must be <= 10"),
        (lambda: read_int("-1", "n", 0, 10), "n = -1: must be >= 0"),
        (lambda: read_float("nan", "f", 0, 1), "f = 'nan': expected a finite number"),
        (lambda: read_float("1e400", "f", 0, 1), "expected a finite number"),
        (lambda: read_float("1.5", "f", 0, 1), "f = 1.5: must be <= 1"),
    ]:
        with pytest.raises(NumberError, match=re.escape(says)):
            call()


def test_a_parser_mistake_is_one_line_and_exit_2(capsys):
    p = ArgumentParser(prog="tool")
    p.add_argument("--n", type=int_arg(1, 8))
    p.add_argument("--size", type=float_arg(0, above=True))
    assert p.parse_args(["--n", "8", "--size", "0.5"]).n == 8
    for argv, says in [
        (["--n", "9"], "argument --n: 9: must be <= 8"),
        (["--size", "0"], "argument --size: 0: must be > 0"),
        (["--size=-inf"], "argument --size: '-inf': expected a finite number"),
        (["--m"], "unrecognized arguments: --m"),
    ]:
        with pytest.raises(SystemExit) as e:
            p.parse_args(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"tool: error: {says}"), err


SCRIPT_CASES = [
    (
        ["prepare_data.py", "in.txt", "--output", "out", "--shard-mb", "-1"],
        "--shard-mb: -1: must be > 0",
    ),
    (["prepare_data.py", "in.txt", "--output", "out", "--workers", "0"], "--workers: 0"),
    (["prepare_data.py", "in.txt", "--output", "out", "--shard-mb", "x"], "'x': expected"),
    (["convert_checkpoint.py", "dcp-to-hf", "a", "b", "--max-shard-size", "0GB"], "'0GB'"),
    (["convert_checkpoint.py", "dcp-to-hf", "a", "b", "--max-shard-size", "9" * 400], "1PiB"),
    (["convert_checkpoint.py", "dcp-to-hf", "a", "b", "--max-position-embeddings", "0"], ": 0"),
    (["submit.py", "--nodes", "0", "--no-submit"], "--nodes: 0: must be >= 1"),
    (["submit.py", "--ngpu", "100000000000000000000", "--no-submit"], "must be <= 1024"),
    (["ray_train.py", "--num-workers", "10" * 20], "must be <= 16777216"),
    (["ray_train.py", "--num-workers", "1", "--max-failures", "-2"], "must be >= -1"),
    (["train_tokenizer.py", "--vocab-size", "0"], "--vocab-size: 0"),
    (["loss_compare.py", "a", "b", "--rtol", "nan"], "'nan': expected a finite number"),
    (["benchmark.py", "--steps", "0"], "--steps: 0: must be >= 1"),
]


def test_every_script_refuses_a_bad_number_in_one_line(tmp_path):
    """Through each script as a user runs it (two at a time: the CI machine has 2 cores), with
    nothing written."""

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(ROOT / "scripts" / argv[0]), *argv[1:]],
            cwd=tmp_path,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )

    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(run, [argv for argv, _ in SCRIPT_CASES]))
    for (argv, says), proc in zip(SCRIPT_CASES, got):
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], (argv, proc.stderr)
    assert not any(tmp_path.iterdir())
