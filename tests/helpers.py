"""Shared test utilities: launch real runs (torchrun, gloo) and read what they wrote."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEBUG_CONFIG = ROOT / "train_configs" / "debug_model.toml"

# Two blocks of the debug model: what a layout does to a block it does to every block, and each
# block costs time in every run of the suite (6 -> 2 halved a group of six 2-rank jobs).
TWO_BLOCKS = ["--model.n_layers", "2"]
# The debug preset scores its eval task after the last step; the tests that are not about
# evaluation leave it out (tests/e2e/test_eval_harness.py and the layout parity's eval layouts
# turn it on).
NO_EVAL = ["--eval.enabled", "false"]
# The tiny run the distributed tests train: the debug model (two blocks) on the bundled corpus,
# 64-token windows in float32, every step logged, no TensorBoard.
TINY_RUN = [
    "--config",
    str(DEBUG_CONFIG),
    *TWO_BLOCKS,
    "--training.seq_len",
    "64",
    "--metrics.log_freq",
    "1",
    "--metrics.enable_tensorboard",
    "false",
    "--training.mixed_precision_param",
    "float32",
    *NO_EVAL,
]
# Muon for the matrices at Moonlight's matched-RMS scale, AdamW for the rest; the float32
# iteration, because under bf16 another layout's last-bit gradient differences round to other
# bf16 values and grow (docs/optimizers.md, Numerics).
MUON = [
    "--optimizer.name",
    "Muon",
    "--optimizer.lr",
    "4e-3",
    "--optimizer.muon_ns_dtype",
    "float32",
]
# The same, deterministic and checkpointing: what the resume, reshard and conversion tests run.
CHECKPOINTED_RUN = [*TINY_RUN, "--training.deterministic", "--checkpoint.enable_checkpoint"]
FSDP2_TP2 = ["--training.local_batch_size", "4", "--parallelism.tensor_parallel_degree", "2"]
# name -> (processes, arguments): the layouts a checkpoint moves between.
LAYOUTS = {
    "one": (1, ["--training.local_batch_size", "8"]),
    "fsdp2": (2, ["--training.local_batch_size", "4"]),
    "tp2": (2, ["--training.local_batch_size", "8", "--parallelism.tensor_parallel_degree", "2"]),
    "fsdp2_tp2": (4, FSDP2_TP2),
    "cp2": (2, ["--training.local_batch_size", "8", "--parallelism.context_parallel_degree", "2"]),
    # Expert parallel (an MoE model): experts over 2 ranks, 4 ranks, 2 of 4 (FSDP 2 each), none.
    "ep2": (2, ["--training.local_batch_size", "4", "--parallelism.expert_parallel_degree", "2"]),
    "ep4": (4, ["--training.local_batch_size", "2", "--parallelism.expert_parallel_degree", "4"]),
    "ep2_fsdp4": (
        4,
        ["--training.local_batch_size", "2", "--parallelism.expert_parallel_degree", "2"],
    ),
    "fsdp4": (4, ["--training.local_batch_size", "2"]),
}
# The smallest run through ./run_train.sh: one step of 2 x 64 tokens (the e2e failure cases).
ONE_STEP = [
    "--training.steps",
    "1",
    "--training.seq_len",
    "64",
    "--training.local_batch_size",
    "2",
    "--metrics.enable_tensorboard",
    "false",
    *NO_EVAL,
]


# A short deterministic 2-rank FSDP run of the debug model, shared by the preemption, restart and
# SLURM tests so that one uninterrupted run (fixture `two_rank_reference`) serves them all.
SHORT_RUN_STEPS = 8
SHORT_RUN = [
    "--config",
    str(DEBUG_CONFIG),
    *TWO_BLOCKS,
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
    *NO_EVAL,
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


def group_timeouts() -> list[tuple[list[int], float]]:
    """(global ranks, collective timeout in seconds) of every process group of this rank (gloo:
    the CPU backend's)."""
    import torch
    import torch.distributed as dist

    world = dist.distributed_c10d._world
    return [
        (
            sorted(world.pg_group_ranks[group]),
            group._get_backend(torch.device("cpu")).options._timeout.total_seconds(),
        )
        for group in list(world.pg_map)
    ]


def launch_worker(
    nproc: int, module: str, args: list[str], timeout: int = 600, **env: str
) -> subprocess.CompletedProcess:
    """`module`.main(args) on `nproc` ranks through titanlite.launch and titanlite.rank, as
    run_train.sh starts titanlite.train, every rank's output shown: for the workers in
    tests/distributed that plant a fault in a real run."""
    cmd = [
        sys.executable,
        "-m",
        "titanlite.launch",
        f"--nproc_per_node={nproc}",
        "--nnodes=1",
        f"--master_port={free_port()}",
        "--local-ranks-filter",
        ",".join(map(str, range(nproc))),
        "-m",
        "titanlite.rank",
        module,
        *args,
    ]
    path = f"{ROOT / 'tests' / 'distributed'}:{ROOT / 'tests'}:{ROOT}"
    return subprocess.run(
        cmd,
        cwd=ROOT,
        env=clean_env(PYTHONPATH=path, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
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
    from titanlite.components.checkpoint.folder import complete_steps

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


def train(
    nproc: int,
    folder: Path,
    *overrides: str,
    base: list[str] = CHECKPOINTED_RUN,
    expect_ok: bool = True,
) -> subprocess.CompletedProcess:
    """`python -m titanlite.train` on `nproc` gloo ranks: `base` (CHECKPOINTED_RUN unless told)
    with its dump folder `folder`, then `overrides`."""
    proc = torchrun(
        nproc, ["-m", "titanlite.train"], [*base, "--job.dump_folder", str(folder), *overrides]
    )
    return check(proc) if expect_ok else proc


def copy_step(src_folder: Path, step: int, dst_folder: Path) -> None:
    """Checkpoint step-N of one run's dump folder into another's, as a relaunch would find it."""
    shutil.copytree(
        src_folder / "checkpoint" / f"step-{step}", dst_folder / "checkpoint" / f"step-{step}"
    )


def convert_checkpoint_main():
    """scripts/convert_checkpoint.py's main(argv), loaded from its file (scripts is no package)."""
    spec = importlib.util.spec_from_file_location(
        "convert_checkpoint", ROOT / "scripts" / "convert_checkpoint.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def run_train(args: list[str], **env: str) -> subprocess.CompletedProcess:
    """./run_train.sh with ONE_STEP, then `args`."""
    return run_script("run_train.sh", [*ONE_STEP, *args], timeout=300, **env)


def in_pairs(cases: dict[str, tuple]) -> dict[str, subprocess.CompletedProcess]:
    """Run {name: (args, env)} through run_train.sh two at a time (the CI machine has 2 cores)."""
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(run_train, a, **env) for name, (a, env) in cases.items()}
        return {name: f.result() for name, f in futures.items()}


def in_process(main, argv: list[str], **env: str) -> subprocess.CompletedProcess:
    """An entry point's main(argv) called in this process with `env` set for the call: its exit
    code and what it printed, as a subprocess would show them; an exception (a traceback
    there) propagates."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def _with_config(args: list[str]) -> list[str]:
    """run_train.sh's command line: `--config` first (the debug preset unless given)."""
    config = str(DEBUG_CONFIG)
    if "--config" in args:
        i = args.index("--config")
        config, args = args[i + 1], args[:i] + args[i + 2 :]
    return ["--config", config, *args]


def preflight(args: list[str], **env: str) -> subprocess.CompletedProcess:
    """What ./run_train.sh's preflight step answers to ONE_STEP + `args`, run in this process:
    the same command line with NGPU (1 unless given) as the world size, `env` set for it."""
    from titanlite.preflight import checks

    ngpu = env.get("NGPU", "1")
    argv = _with_config([*ONE_STEP, *args])
    return in_process(checks.main, argv, **{**env, "WORLD_SIZE": ngpu, "NGPU": ngpu})


def dry_run(*args: str, **env: str) -> subprocess.CompletedProcess:
    """What `./run_train.sh --dry-run *args` answers, run in this process."""
    from titanlite.planning import dry_run as planning

    return in_process(planning.main, _with_config(list(args)), **env)


def preflight_cases(
    cases: dict[str, tuple], *, shell: tuple[str, ...]
) -> dict[str, subprocess.CompletedProcess]:
    """{name: (args, env)} through `preflight`, except those named in `shell`, which go through
    ./run_train.sh itself (`in_pairs`): each test keeps its kind of error proven at the real
    entry point (exit code and last line after the shell script and torchrun's launcher)."""
    assert shell and set(shell) <= set(cases), shell
    inline = {n: c for n, c in cases.items() if n not in shell}
    got = {name: preflight(a, **env) for name, (a, env) in inline.items()}
    return {**got, **in_pairs({n: cases[n] for n in shell})}


def last_line(proc: subprocess.CompletedProcess) -> str:
    """The last non-empty line on stderr: what the user was told last."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def expect_one_line(proc: subprocess.CompletedProcess, code: int, *parts: str) -> None:
    """The process exited `code`, and its last stderr line holds every one of `parts`."""
    line = last_line(proc)
    assert proc.returncode == code and all(p in line for p in parts), (
        f"exit {proc.returncode}, last line {line!r}\n{proc.stderr[-3000:]}"
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
    )
    return proc


def _spawn_entry(rank: int, fn, world_size: int, port: int, args: tuple) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)  # as torchrun's workers (OMP_NUM_THREADS=1): ranks share 2 cores
    dist.init_process_group("gloo")
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


# What the fork server imports once, so that each rank it forks starts without importing torch
# (seconds per process on 2 cores).
SPAWN_PRELOAD = ["torch", "torch.distributed", "titanlite.trainer.trainer", "helpers"]


def spawn(fn, world_size: int, *args) -> None:
    """Run fn(rank, world_size, *args) in world_size processes on a real gloo process group:
    forked from a server that has torch imported (the tests that are about the launcher use
    torchrun instead)."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload(SPAWN_PRELOAD)
    mp.start_processes(
        _spawn_entry,
        args=(fn, world_size, free_port(), args),
        nprocs=world_size,
        start_method="forkserver",
    )


def guarded_steps(guard, norms: list[float], fused: bool = True):
    """Steps with these global gradient norms through `guard` and a real AdamW (one parameter,
    gradient 1): yields (step, the parameter after it)."""
    import torch  # here: most users of this module never need torch

    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.AdamW([weight], lr=0.1, fused=fused, foreach=not fused)
    for step, norm in enumerate(norms, 1):
        weight.grad = torch.ones(2)
        guard.step_optimizer(optimizer, step, torch.tensor(norm))
        yield step, weight.detach().clone()


def tiny_llama_args(**overrides):
    """A 2-block Llama of dim 64 over 256 token ids and 64 positions: cheap to run and compile."""
    from models.llama import LlamaArgs

    shape = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, max_seq_len=64)
    return LlamaArgs(**{**shape, "bos_id": 0, "rope_scaling": None, **overrides})


# Token ids that start and end a document in the document-masking tests' model.
DOC_BOS, DOC_EOS = 1, 2


def document_model_args(**overrides):
    """A 2-block Llama of dim 64 over 40 token ids and 32 positions, masked block_causal with
    documents starting at DOC_BOS: the document-masking and RoPE-position tests' model."""
    from models.llama import LlamaArgs

    shape = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=40, max_seq_len=32)
    return LlamaArgs(**{**shape, "bos_id": DOC_BOS, "attn_mask_type": "block_causal", **overrides})


def document_model(**overrides):
    """That model, initialized with seed 0."""
    from models.llama import Transformer

    model = Transformer(document_model_args(**overrides))
    model.init_weights(seed=0)
    return model


def make_hf_llama(
    folder: Path,
    *,
    n_kv_heads: int = 16,
    n_layers: int = 6,
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
        num_hidden_layers=n_layers,
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


def one_process_train_step(model, optimizer, lr_scheduler, max_norm: float):
    """The trainer's own step (TrainStep) on one CPU process, fp32, no parallelism."""
    import torch

    from titanlite.components.loss import cross_entropy_sum
    from titanlite.components.nonfinite import NonFiniteGuard
    from titanlite.trainer.train_step import TrainStep

    return TrainStep(
        model,
        optimizer,
        lr_scheduler,
        cross_entropy_sum,
        step=lambda: 1,
        device=torch.device("cpu"),
        amp=contextlib.nullcontext(),
        loss_parallel=False,
        sequence_shards=None,
        loss_ranks=1,
        global_sum=lambda t: t,
        max_norm=max_norm,
        nonfinite=NonFiniteGuard(0),
    )
