"""Failure handling through the real entry points (issue 14, sections 1, 3, 4, 5): every case is
one line, the right exit code, and nothing lost. Cases that only the preflight step decides run it
in this process (helpers.preflight: run_train.sh's command line, without starting a shell and a
Python for each); those the shell script reads (NGPU), the checkpoint and data cases and the
cases only a rank can see go through run_train.sh, two at a time, and titanlite.launch."""

import json
import os
import pickle
import shutil
import subprocess
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch.distributed as dist
from helpers import (
    DEBUG_CONFIG,
    ONE_STEP,
    ROOT,
    check,
    clean_env,
    expect_one_line,
    in_pairs,
    preflight_cases,
    run_python,
    run_train,
    save_hf_dataset,
)

BUILTIN_TOKENIZER = ROOT / "titanlite" / "assets" / "tokenizer" / "tokenizer.json"
CORPUS = ROOT / "titanlite" / "assets" / "corpus"


def script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *map(str, args)],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


class _Exploit:
    """What a crafted `.metadata` holds: unpickling it with plain pickle runs os.system."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def craft_metadata(ckpt: Path, marker: Path) -> None:
    """Replace `.metadata` by an exploit and fix the manifest's record of it, as an attacker
    would, so that only the unpickler stands in the way."""
    meta = ckpt / ".metadata"
    meta.write_bytes(pickle.dumps(_Exploit(marker)))
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"][".metadata"] = {
        "size": meta.stat().st_size,
        "crc32": zlib.crc32(meta.read_bytes()),
    }
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    """A real 1-step run with a checkpoint (step-1), copied by the tests that damage it."""
    folder = tmp_path_factory.mktemp("saved_run")
    check(run_train(["--job.dump_folder", str(folder), "--checkpoint.enable_checkpoint"]))
    assert (folder / "checkpoint" / "step-1" / "manifest.json").is_file()
    return folder


def copy_run(saved_run: Path, dst: Path) -> Path:
    shutil.copytree(saved_run / "checkpoint", dst / "checkpoint")
    return dst / "checkpoint" / "step-1"


def no_tracebacks(runs: dict[str, subprocess.CompletedProcess]) -> None:
    for proc in runs.values():
        assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.slow
def test_checkpoint_problems_stop_in_preflight_with_one_line(saved_run, tmp_path):
    runs = {}
    names = ("truncated", "no_metadata", "other_model", "fewer_blocks", "partial", "load_step")
    names += ("switched_optimizer",)
    for name in (*names, "crafted"):
        runs[name] = tmp_path / name
        runs[name].mkdir()
    ck = copy_run(saved_run, runs["truncated"])
    distcp = next(ck.glob("*.distcp"))
    with distcp.open("r+b") as f:
        f.truncate(distcp.stat().st_size // 2)
    (copy_run(saved_run, runs["no_metadata"]) / ".metadata").unlink()
    copy_run(saved_run, runs["other_model"])
    copy_run(saved_run, runs["fewer_blocks"])
    copy_run(saved_run, runs["load_step"])
    copy_run(saved_run, runs["switched_optimizer"])
    marker = tmp_path / "exploit-ran"
    craft_metadata(copy_run(saved_run, runs["crafted"]), marker)

    def args(name: str, *extra: str) -> tuple:
        return (
            ["--job.dump_folder", str(runs[name]), "--checkpoint.enable_checkpoint", *extra],
            {},
        )

    got = in_pairs(
        {
            "truncated": args("truncated"),
            "no_metadata": args("no_metadata"),
            "other_model": args("other_model", "--model.dim", "128"),
            # The extra blocks would be dropped and a smaller model trained (issue 46).
            "fewer_blocks": args("fewer_blocks", "--model.n_layers", "3"),
            # ... unless asked for: a truncated model fine-tuned from the full one.
            "partial": args(
                "partial",
                "--model.n_layers",
                "3",
                "--checkpoint.initial_load_path",
                str(saved_run / "checkpoint" / "step-1"),
                "--checkpoint.allow_partial_model_load",
            ),
            "load_step": args("load_step", "--checkpoint.load_step", "7"),
            # AdamW's moments cannot continue as Muon's momentum (issue 48).
            "switched_optimizer": args("switched_optimizer", "--optimizer.name", "Muon"),
            "crafted": args("crafted"),
        }
    )
    expect_one_line(
        got["truncated"], 2, "titanlite: error: cannot load", distcp.name, "(truncated?)"
    )
    expect_one_line(got["no_metadata"], 2, "titanlite: error: cannot load", ".metadata is missing")
    expect_one_line(got["other_model"], 2, "step 1", "saved with dim = 256 (checkpoint) vs 128")
    expect_one_line(
        got["fewer_blocks"],
        2,
        "titanlite: error: checkpoint step 1",
        "saved with n_layers = 6 (checkpoint) vs 3 (configured), which changes the model's",
        "checkpoint.allow_partial_model_load",
    )
    check(got["partial"])
    assert "loading 30 of the checkpoint's 57 model tensors" in got["partial"].stderr
    expect_one_line(got["load_step"], 2, "checkpoint.load_step = 7", "complete: [1]")
    expect_one_line(got["crafted"], 2, "names posix.system", "refusing to unpickle")
    expect_one_line(
        got["switched_optimizer"],
        2,
        "titanlite: error: checkpoint step 1",
        "has AdamW optimizer state, but optimizer.name = 'Muon'",
        "--checkpoint.exclude_from_loading optimizer,lr_scheduler",
    )
    assert not marker.exists()
    del got["partial"]
    for proc in got.values():  # preflight stopped them: no torchrun, no traceback
        assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr
    # What was there is kept: the refused checkpoints are untouched, and nothing was added.
    assert next((runs["truncated"] / "checkpoint" / "step-1").glob("*.distcp")).exists()
    assert sorted(p.name for p in runs["fewer_blocks"].iterdir()) == [".run.lock", "checkpoint"]
    assert [p.name for p in (runs["fewer_blocks"] / "checkpoint").iterdir()] == ["step-1"]


@pytest.mark.slow
def test_errors_only_a_rank_sees_end_the_output_with_its_line_and_exit_code(saved_run, tmp_path):
    # A bit flip keeps the size (preflight passes) and only the ranks' CRC pass sees it: the
    # line comes from rank 0 through titanlite.launch, torchrun's report goes to torchrun.log.
    ck = copy_run(saved_run, tmp_path)
    distcp = next(ck.glob("*.distcp"))
    with distcp.open("r+b") as f:
        f.seek(1000)
        b = f.read(1)
        f.seek(1000)
        f.write(bytes([b[0] ^ 0xFF]))
    proc = run_train(["--job.dump_folder", str(tmp_path), "--checkpoint.enable_checkpoint"])
    expect_one_line(proc, 2, "titanlite: error: cannot load", "is corrupted (CRC32 differs")
    assert "ChildFailedError" not in proc.stderr and "=====" not in proc.stderr
    assert proc.stderr.count("titanlite: error:") == 1, proc.stderr[-3000:]  # the launcher's
    assert "exitcode  : 2" in (tmp_path / "torchrun.log").read_text()


@pytest.mark.slow
def test_shard_crc_mismatch_through_run_train(tmp_path):
    shards = tmp_path / "shards"
    check(script("prepare_data.py", CORPUS, "--output", shards, "--workers", "1"))
    bin_file = next(shards.glob("shard_*.bin"))
    with bin_file.open("r+b") as f:  # same size, other bytes: only the CRC pass can tell
        f.seek(101)
        b = f.read(1)
        f.seek(101)
        f.write(bytes([b[0] ^ 0x01]))
    proc = run_train(
        ["--job.dump_folder", str(tmp_path / "run"), "--training.dataset_path", str(shards)]
    )
    expect_one_line(proc, 2, "titanlite: error:", bin_file.name, "is corrupted")
    assert "ChildFailedError" not in proc.stderr
    # Once: the launcher's copy alone, not the rank's before it.
    assert proc.stderr.count("titanlite: error:") == 1, proc.stderr[-3000:]


def fake_rank_module(folder: Path) -> Path:
    (folder / "fake_rank.py").write_text(
        "import os, signal, sys\n"
        "def main(argv):\n"
        "    code = int(argv[0])\n"
        "    if os.environ['RANK'] == '1':\n"
        "        if code == 1:\n"
        "            raise ValueError('a bug, not the user')\n"
        "        print(f'rank 1 says goodbye with {code}', file=sys.stderr)\n"
        "        return code\n"
        "    signal.pause()  # rank 0 waits to be stopped by torchrun\n"
    )
    return folder


@pytest.mark.slow
def test_launcher_passes_the_rank_code_and_line(tmp_path):
    # titanlite.launch itself, on a stand-in rank module (no model): the exit codes a rank uses
    # on purpose come out unchanged with the rank's last line; a crash names the rank.
    fake_rank_module(tmp_path)

    def launch(code: int) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "titanlite.launch", "--nproc_per_node=2", "--standalone"]
        cmd += ["-m", "titanlite.rank", "fake_rank", str(code), "--job.dump_folder", str(tmp_path)]
        env = clean_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

    with ThreadPoolExecutor(2) as pool:
        got = dict(zip((3, 75, 130, 1), pool.map(launch, (3, 75, 130, 1))))
    for code in (3, 75, 130):
        expect_one_line(got[code], code, f"rank 1 says goodbye with {code}")
        assert "ChildFailedError" not in got[code].stderr
    expect_one_line(got[1], 1, "titanlite: error: rank 1 exited with code 1: ValueError: a bug")


def tokenizer_with_config(folder: Path, **cfg: str) -> Path:
    folder.mkdir()
    shutil.copy(BUILTIN_TOKENIZER, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.slow
def test_preflight_catches_path_size_and_input_mistakes(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    (tmp_path / "ckfile").mkdir()
    (tmp_path / "ckfile" / "checkpoint").write_text("x")
    bad_toml = tmp_path / "latin1.toml"
    bad_toml.write_bytes(b'[job]\ndescription = "caf\xe9"\n')
    malformed = tmp_path / "malformed"
    malformed.mkdir()
    (malformed / "a.jsonl").write_text('{"text": 1}\nnot json\n{"other": "x"}\n')
    latin1 = tmp_path / "latin1"
    latin1.mkdir()
    (latin1 / "a.txt").write_bytes(b"caf\xe9 " * 200)
    short = tmp_path / "short"
    short.mkdir()
    (short / "a.txt").write_text("hello world")
    tok = tokenizer_with_config(tmp_path / "tok", bos_token="<nope>", eos_token="<|end_of_text|>")
    hf = save_hf_dataset(tmp_path / "hf", ["a document " * 40] * 4, column="body", num_shards=1)
    from datasets import DatasetDict, load_from_disk

    DatasetDict(train=load_from_disk(str(hf))).save_to_disk(str(tmp_path / "hf_dict"))
    dump = ["--job.dump_folder", str(tmp_path / "out")]
    cases = {
        "dump_is_file": (["--job.dump_folder", str(a_file)], {}),
        "ckpt_is_file": (
            ["--job.dump_folder", str(tmp_path / "ckfile"), "--checkpoint.enable_checkpoint"],
            {},
        ),
        "unwritable": (["--job.dump_folder", "/proc/titanlite-cannot-write-here"], {}),
        "config_folder": (["--config", str(tmp_path), *dump], {}),
        "config_latin1": (["--config", str(bad_toml), *dump], {}),
        "ngpu_abc": (dump, {"NGPU": "abc"}),
        "ngpu_0": (dump, {"NGPU": "0"}),
        "seq_len": ([*dump, "--training.seq_len", "1000000"], {}),
        "bos_missing": ([*dump, "--model.tokenizer_path", str(tok)], {}),
        "jsonl_malformed": ([*dump, "--training.dataset_path", str(malformed)], {}),
        "text_not_utf8": ([*dump, "--training.dataset_path", str(latin1)], {}),
        "text_short": ([*dump, "--training.dataset_path", str(short)], {}),
        "hf_column": ([*dump, "--training.dataset_path", str(hf)], {}),
        "hf_dict": ([*dump, "--training.dataset_path", str(tmp_path / "hf_dict")], {}),
        "rope_causal": (
            [*dump, "--model.attn_mask_type", "causal", "--model.rope_positions", "document"],
            {},
        ),
        "budget_no_compile": ([*dump, "--activation_checkpoint.mode", "memory_budget"], {}),
        "float16": ([*dump, "--training.mixed_precision_param", "float16"], {}),
        "budget_range": (
            [*dump, "--training.compile", "--activation_checkpoint.memory_budget", "-0.1"],
            {},
        ),
    }
    # NGPU is read by the shell script: those two go through run_train.sh, and float16 (new
    # this round) too, for its exit code and last line at the real entry point.
    got = preflight_cases(cases, shell=("ngpu_abc", "ngpu_0", "float16"))
    expect_one_line(got["dump_is_file"], 2, f"job.dump_folder: {a_file} is an existing file")
    expect_one_line(got["ckpt_is_file"], 2, "checkpoint.folder:", "is an existing file")
    expect_one_line(got["unwritable"], 2, "job.dump_folder: cannot write to /proc/titanlite-cannot")
    expect_one_line(got["config_folder"], 2, f"{tmp_path} is a folder; pass a .toml file")
    expect_one_line(got["config_latin1"], 2, "latin1.toml: not UTF-8 text (byte 24")
    expect_one_line(got["ngpu_abc"], 2, "NGPU=abc: expected a positive number")
    expect_one_line(got["ngpu_0"], 2, "NGPU=0: expected a positive number")
    expect_one_line(
        got["seq_len"], 2, "seq_len = 1000000 is beyond the model's max_seq_len of 131072"
    )
    expect_one_line(got["bos_missing"], 2, "bos_token '<nope>' is not in the vocabulary")
    expect_one_line(
        got["jsonl_malformed"], 2, "no readable document; 3 malformed record(s)", "a.jsonl:1"
    )
    expect_one_line(
        got["text_not_utf8"], 2, "no readable document; 1 malformed", "a.txt: not UTF-8"
    )
    expect_one_line(got["text_short"], 2, "tokens, fewer than one window of seq_len + 1 = 65")
    expect_one_line(got["hf_column"], 2, "no column 'text' (columns: id, body); set the text field")
    expect_one_line(got["hf_dict"], 2, "is a Hugging Face DatasetDict (splits: train); point it at")
    expect_one_line(got["rope_causal"], 2, "rope_positions = 'document' needs attn_mask_type")
    expect_one_line(
        got["budget_no_compile"], 2, "mode = 'memory_budget'", "needs training.compile = true"
    )
    expect_one_line(
        got["budget_range"], 2, "[activation_checkpoint] memory_budget = -0.1: must be >= 0.0"
    )
    expect_one_line(got["float16"], 2, "mixed_precision_param = 'float16' needs a gradient scaler")
    no_tracebacks(got)
    assert a_file.read_text() == "x"  # nothing overwritten


@pytest.mark.slow
def test_shards_shorter_than_one_window_through_run_train(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("a few words, far fewer than one window")
    check(script("prepare_data.py", short, "--output", tmp_path / "shards", "--workers", "1"))
    proc = run_train(
        [
            "--job.dump_folder",
            str(tmp_path / "run"),
            "--training.dataset_path",
            str(tmp_path / "shards"),
        ]
    )
    expect_one_line(proc, 2, "tokens, fewer than one window of training seq_len + 1 = 65")


def test_prepare_data_rerun_remakes_damaged_shards_and_refuses_bad_destinations(tmp_path):
    out = tmp_path / "shards"
    check(
        script("prepare_data.py", CORPUS, "--output", out, "--workers", "1", "--shard-mb", "0.05")
    )
    bins = sorted(out.glob("shard_*.bin"))
    assert len(bins) >= 3
    originals = {p.name: p.read_bytes() for p in out.glob("shard_*.*")}
    with bins[0].open("r+b") as f:
        f.truncate(10)
    data = bytearray(bins[1].read_bytes())
    data[5] ^= 0xFF
    bins[1].write_bytes(bytes(data))
    (out / bins[2].name.replace(".bin", ".idx")).unlink()
    assert script("prepare_data.py", "--verify", out).returncode != 0
    rerun = check(
        script("prepare_data.py", CORPUS, "--output", out, "--workers", "1", "--shard-mb", "0.05")
    )
    assert rerun.stderr.count("making that shard again") == 3, rerun.stderr
    assert check(script("prepare_data.py", "--verify", out)).stdout.rstrip().endswith(")")
    assert {p.name: p.read_bytes() for p in out.glob("shard_*.*")} == originals

    malformed = tmp_path / "bad.jsonl"
    malformed.write_text('{"text": 1}\nnot json\n')
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for args, words in (
        ((malformed, "--output", tmp_path / "none"), "the input yields no tokens (2 malformed"),
        ((CORPUS, "--output", a_file), f"--output {a_file} is an existing file"),
        ((CORPUS, "--output", a_file / "sub"), "cannot create it"),
    ):
        proc = script("prepare_data.py", *args, "--workers", "1")
        expect_one_line(proc, 2, "prepare: error:", words)
    assert not (tmp_path / "none" / "manifest.json").exists()
    assert a_file.read_text() == "x"


@pytest.mark.slow
def test_convert_checkpoint_refuses_crafted_metadata_and_bad_destinations(saved_run, tmp_path):
    ck = copy_run(saved_run, tmp_path)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for dst, words in (
        (a_file, f"{a_file} already exists"),
        (a_file / "model.pt", f"{a_file} is a file, not a folder"),
    ):
        expect_one_line(script("convert_checkpoint.py", "dcp-to-torch", ck, dst), 2, words)
    good = tmp_path / "model.pt"
    check(script("convert_checkpoint.py", "dcp-to-torch", ck, good))  # the real one loads
    marker = tmp_path / "exploit-ran"
    craft_metadata(ck, marker)
    proc = script("convert_checkpoint.py", "dcp-to-torch", ck, tmp_path / "other.pt")
    expect_one_line(proc, 2, "convert_checkpoint: error:", "names posix.system")
    assert not marker.exists()


@pytest.mark.slow
def test_every_reader_refuses_a_crafted_metadata_on_its_own(saved_run, tmp_path):
    """Each way titanlite reads a checkpoint refuses a crafted `.metadata` by itself, not only
    behind preflight's check: the readers, the trainer's resume, `checkpoint verify`, and
    convert_checkpoint.py's readers (dcp-to-torch is in the test above)."""
    from titanlite.components.checkpoint.folder import CheckpointError
    from titanlite.components.checkpoint.storage import (
        SafeFileSystemReader,
        load_full_state_dict,
        read_metadata,
    )
    from titanlite.preflight import checks as preflight
    from titanlite.trainer.trainer import Trainer

    ck = copy_run(saved_run, tmp_path)
    marker = tmp_path / "exploit-ran"
    craft_metadata(ck, marker)
    refused = "names posix.system"
    readers = {
        "read_metadata": read_metadata,
        "SafeFileSystemReader": lambda p: SafeFileSystemReader(str(p)).read_metadata(),
        "load_full_state_dict": load_full_state_dict,
    }
    for name, read in readers.items():
        with pytest.raises(CheckpointError, match=refused):
            read(ck)
            pytest.fail(f"{name} read the crafted metadata")
    # The trainer's resume, with preflight's own look at the checkpoint skipped: preflight
    # runs with checkpointing off, and the job then turns it on.
    argv = ["--config", str(DEBUG_CONFIG), *ONE_STEP, "--job.dump_folder", str(tmp_path)]
    job, pre = preflight.run(argv, 1)
    job.checkpoint.enable_checkpoint = True
    try:
        with pytest.raises(CheckpointError, match=refused):
            Trainer(job, pre).close()
    finally:  # the trainer's group, left by the failed start: other tests here need none
        if dist.is_initialized():
            dist.destroy_process_group()
    verified = run_python(["-m", "titanlite.checkpoint", "verify", str(ck)])
    assert verified.returncode == 1 and refused in verified.stdout, verified.stdout
    to_hf = script("convert_checkpoint.py", "dcp-to-hf", ck, tmp_path / "hf")
    expect_one_line(to_hf, 2, "convert_checkpoint: error:", refused)
    assert not marker.exists()


@pytest.mark.slow
def test_impossible_pipeline_layouts_stop_before_launch(tmp_path):
    dump = ["--job.dump_folder", str(tmp_path / "out")]
    pp = ["--parallelism.pipeline_parallel_degree"]
    cases = {
        "schedule": ([*dump, *pp, "2", "--parallelism.pipeline_parallel_schedule", "2F2B"], {}),
        "few_microbatches": ([*dump, *pp, "4"], {"NGPU": "4"}),
        "microbatch_size": (
            [*dump, *pp, "2", "--parallelism.pipeline_parallel_microbatch_size", "3"],
            {},
        ),
        "layers": (
            [*dump, *pp, "4", "--model.n_layers", "1", "--training.local_batch_size", "4"],
            {"NGPU": "4"},
        ),
        "validation": (
            [
                *dump,
                *pp,
                "2",
                "--validation.enabled",
                "--validation.dataset_path",
                str(CORPUS),
                "--validation.seq_len",
                "32",
            ],
            {},
        ),
        "world": ([*dump, *pp, "4"], {}),
    }
    for _, env in cases.values():
        env.setdefault("NGPU", "2")
    got = preflight_cases(cases, shell=("world",))
    expect_one_line(got["schedule"], 2, "'2F2B' is not a schedule of torch.distributed.pipelining")
    expect_one_line(
        got["few_microbatches"], 2, "needs at least as many micro-batches as stages (4)"
    )
    expect_one_line(got["microbatch_size"], 2, "local_batch_size = 2 is not divisible by pipeline_")
    expect_one_line(got["layers"], 2, "1 block(s) do not split into 4 pipeline stages")
    expect_one_line(
        got["validation"], 2, "under pipeline parallel validates with the training shapes"
    )
    expect_one_line(
        got["world"], 2, "world size 2 is not divisible by pipeline_parallel_degree (4)"
    )
    no_tracebacks(got)


def test_impossible_context_parallel_layouts_stop_before_launch(tmp_path):
    dump = ["--job.dump_folder", str(tmp_path / "out")]
    cp = ["--parallelism.context_parallel_degree"]
    cases = {
        "seq_len": ([*dump, *cp, "2", "--training.seq_len", "90"], {}),
        "alltoall": (
            [*dump, *cp, "2", "--parallelism.context_parallel_rotate_method", "alltoall"],
            {},
        ),
        "flex": ([*dump, *cp, "2", "--model.attn_type", "flex"], {}),
        "world": ([*dump, *cp, "4"], {}),
    }
    for _, env in cases.values():
        env.setdefault("NGPU", "2")
    got = preflight_cases(cases, shell=("seq_len",))
    expect_one_line(
        got["seq_len"], 2, "training.seq_len = 90 is not divisible by 2 x context_parallel"
    )
    expect_one_line(got["alltoall"], 2, "context_parallel_rotate_method = 'alltoall' is not built")
    expect_one_line(got["flex"], 2, "'flex' is not wired for it")
    expect_one_line(got["world"], 2, "world size 2 is not divisible by context_parallel_degree (4)")
    no_tracebacks(got)


def test_impossible_expert_parallel_layouts_stop_before_launch(tmp_path):
    dump = ["--job.dump_folder", str(tmp_path / "out")]
    ep = ["--parallelism.expert_parallel_degree"]
    moe = ["--model.name", "qwen3", "--model.flavor", "debugmodel_moe"]  # 8 experts
    cases = {
        "dense": ([*dump, *ep, "2"], {}),
        "borrowed": ([*dump, *moe, *ep, "4"], {}),  # 2 ranks of dp_shard to borrow from
        "experts": ([*dump, *moe, *ep, "3", "--training.local_batch_size", "3"], {"NGPU": "3"}),
        "zero": ([*dump, *moe, *ep, "0"], {}),
    }
    for _, env in cases.values():
        env.setdefault("NGPU", "2")
    got = preflight_cases(cases, shell=("borrowed",))
    expect_one_line(got["dense"], 2, "expert_parallel_degree = 2 needs a Mixture-of-Experts")
    expect_one_line(got["dense"], 2, "this model has 0 experts: pick an MoE flavor")
    expect_one_line(
        got["borrowed"], 2, "expert_parallel_degree = 4 does not divide data_parallel_shard_degree"
    )
    expect_one_line(got["experts"], 2, "this model has 8 experts: pick a divisor of it")
    expect_one_line(got["zero"], 2, "expert_parallel_degree")
    no_tracebacks(got)
