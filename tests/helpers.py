"""Shared test utilities: launch real runs (torchrun, gloo) and read what they wrote."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEBUG_CONFIG = ROOT / "train_configs" / "debug_model.toml"


# A short deterministic 2-rank FSDP run of the debug model, shared by the preemption, restart and
# SLURM tests so that one uninterrupted run (fixture `two_rank_reference`) serves them all.
SHORT_RUN_STEPS = 8
SHORT_RUN = [
    "--config",
    str(DEBUG_CONFIG),
    "--training.seq_len",
    "64",
    "--training.local_batch_size",
    "4",
    "--metrics.log_freq",
    "1",
    "--metrics.enable_tensorboard",
    "false",
    "--training.deterministic",
    "--checkpoint.enable_checkpoint",
    "--training.steps",
    str(SHORT_RUN_STEPS),
]


def losses_by_step(folder: Path) -> dict[int, float]:
    """metrics.jsonl as {step: loss}; a relaunch appends, so the last record of a step wins."""
    return {r["step"]: r["loss"] for r in read_jsonl(folder / "metrics.jsonl")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Set by a launcher around the tests; RAY_ADDRESS too: the Ray tests start a private local
# instance, never a user's cluster.
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "RAY_ADDRESS")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def torchrun(
    nproc: int, module_or_script: list[str], args: list[str], timeout: int = 600, **env: str
) -> subprocess.CompletedProcess:
    """Run under torchrun with a private rendezvous port (tests may run side by side)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--nnodes=1",
        f"--master_port={free_port()}",
        *module_or_script,
        *args,
    ]
    return subprocess.run(
        cmd, cwd=ROOT, env=clean_env(**env), capture_output=True, text=True, timeout=timeout
    )


def run_script(
    script: str, args: list[str], timeout: int = 600, **env: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ROOT / script), *args],
        cwd=ROOT,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_python(args: list[str], timeout: int = 600, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_for_step(folder: Path, step: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until `folder` holds a complete checkpoint of `step` or later (the run still going)."""
    from titanlite.components.checkpoint.storage import complete_steps

    deadline = time.time() + timeout
    while not any(s >= step for s in complete_steps(folder / "checkpoint")):
        assert proc.poll() is None, f"run ended early: {proc.communicate()[1][-3000:]}"
        assert time.time() < deadline, "no checkpoint in time"
        time.sleep(0.05)


def resumed_step_and_same_losses(log: str, folder: Path, reference: dict[int, float]) -> int:
    """After a restart: the one step the run resumed at, having checked that every step, the
    re-done ones included, equals the uninterrupted run bit for bit."""
    resumed = [ln for ln in log.splitlines() if "resuming at step" in ln]
    assert len(resumed) == 1, log[-4000:]
    got = losses_by_step(folder)
    assert sorted(got) == sorted(reference)
    assert all(got[s] == reference[s] for s in got), (got, reference)
    return int(resumed[0].rsplit(" ", 1)[1])


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
    )
    return proc


def _spawn_entry(rank: int, fn, world_size: int, port: int, args: tuple) -> None:
    import torch.distributed as dist

    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    dist.init_process_group("gloo")
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def spawn(fn, world_size: int, *args) -> None:
    """Run fn(rank, world_size, *args) in world_size processes on a real gloo process group."""
    import torch.multiprocessing as mp

    mp.start_processes(
        _spawn_entry,
        args=(fn, world_size, free_port(), args),
        nprocs=world_size,
        start_method="spawn",
    )


def tiny_llama_args(**overrides):
    """A 2-block Llama of dim 64 over 256 token ids and 64 positions: cheap to run and compile."""
    from models.llama import LlamaArgs

    shape = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, max_seq_len=64)
    return LlamaArgs(**{**shape, "bos_id": 0, "rope_scaling": None, **overrides})


def make_hf_llama(
    folder: Path,
    *,
    n_kv_heads: int = 16,
    dtype: str = "float32",
    vocab_size: int = 512,
    seed: int = 0,
    **save_kwargs,
) -> Path:
    """A random Llama of the debug model's shape, written by transformers itself (its own init,
    std 0.05 so that attention patterns matter, and norms away from 1 so that a mix-up of norm
    weights shows)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=6,
        num_attention_heads=16,
        num_key_value_heads=n_kv_heads,
        vocab_size=vocab_size,
        rms_norm_eps=1e-5,
        max_position_embeddings=131072,
        initializer_range=0.05,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    model.to(getattr(torch, dtype)).save_pretrained(folder, **save_kwargs)
    return folder


def corpus_paragraphs() -> list[str]:
    """The bundled corpus cut at blank lines: many short documents, in file order."""
    corpus = ROOT / "titanlite" / "assets" / "corpus"
    return [
        p
        for f in sorted(corpus.rglob("*"))
        if f.is_file()
        for p in f.read_text().split("\n\n")
        if p.strip()
    ]


def save_hf_dataset(folder: Path, rows: list, column: str = "text", num_shards: int = 3) -> Path:
    """A dataset written by `datasets` itself (`save_to_disk`), in several arrow files, with an
    extra column so that the text column must be chosen by name."""
    from datasets import Dataset

    ds = Dataset.from_dict({"id": list(range(len(rows))), column: rows})
    ds.save_to_disk(str(folder), num_shards=num_shards)
    return folder
