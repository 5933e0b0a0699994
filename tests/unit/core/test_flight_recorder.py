"""comm.trace_buf_size and comm.save_traces_folder reach NCCL's flight recorder: on CUDA the
rank's environment gets torch 2.13's variables before the process group exists, and the dump
folder is made under the dump folder; on CPU (gloo, no NCCL) nothing is set."""

from pathlib import Path

import pytest

from titanlite.config.loader import load
from titanlite.core.distributed import enable_flight_recorder, flight_recorder_env


def _traces(tmp_path: Path, *argv: str) -> tuple[int, Path]:
    job = load(["--job.dump_folder", str(tmp_path / "out"), *argv])
    return job.comm.trace_buf_size, Path(job.job.dump_folder) / job.comm.save_traces_folder


def test_cuda_rank_gets_the_flight_recorder_variables_and_folder(tmp_path):
    size, folder = _traces(tmp_path, "--comm.trace_buf_size", "1234")
    env = {"PATH": "/bin"}
    added = enable_flight_recorder("cuda", size, folder, env)
    prefix = str(tmp_path / "out" / "comm_traces" / "rank_")
    assert env == {
        "PATH": "/bin",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "1234",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": prefix,
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
    }
    assert added == {k: v for k, v in env.items() if k != "PATH"}
    assert folder.is_dir()


def test_user_variables_win_cpu_sets_nothing_and_zero_turns_it_off(tmp_path):
    size, folder = _traces(tmp_path, "--comm.save_traces_folder", "fr")
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}
    enable_flight_recorder("cuda", size, folder, env)
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "50"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "out" / "fr" / "rank_")

    cpu: dict[str, str] = {}
    other = tmp_path / "cpu"
    assert enable_flight_recorder("cpu", size, other, cpu) == {} and cpu == {}
    assert not other.exists()

    off: dict[str, str] = {}
    enable_flight_recorder("cuda", 0, other, off)
    assert off == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"} and not other.exists()


def test_torch_reads_every_variable_by_that_name():
    """Each name is one that this torch's c10d reads: in its NCCL/flight-recorder headers or as a
    string in libtorch_cpu (the CPU wheel has no ProcessGroupNCCL.cpp, but ships its header)."""
    import mmap

    import torch

    root = Path(torch.__file__).parent
    if not (root / "lib" / "libtorch_cpu.so").exists():
        pytest.skip("reads a Linux torch wheel's libtorch_cpu.so")
    headers = "".join(
        p.read_text() for p in (root / "include/torch/csrc/distributed/c10d").glob("*.hpp")
    )
    with open(root / "lib" / "libtorch_cpu.so", "rb") as f:
        lib = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        for name in flight_recorder_env(1, Path("x")):
            assert f'"{name}"' in headers or lib.find(name.encode() + b"\0") >= 0, name
