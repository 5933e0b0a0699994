import os
import subprocess
import sys

import pytest
from helpers import DEBUG_CONFIG, ROOT, clean_env

from titanlite.config import loader as config
from titanlite.config.loader import ConfigError
from titanlite.preflight import checks as preflight


def load(*argv: str):
    return config.load(list(argv))


def test_defaults_toml_and_cli_precedence(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text("[training]\nsteps = 7\nseq_len = 64\n[optimizer]\nlr = 0.1\n")
    cfg = load("--config", str(toml), "--training.steps", "9")
    assert cfg.training.steps == 9  # CLI beats TOML
    assert cfg.training.seq_len == 64  # TOML beats default
    assert cfg.training.local_batch_size == 8  # default
    assert cfg.optimizer.lr == 0.1


def test_cli_forms():
    cfg = load(
        "--training.steps=3",
        "--training.compile",
        "--metrics.enable_tensorboard",
        "false",
        "--float8.filter_fqns",
        "output,layers.0",
        "--training.seed",
        "none",
        "--activation_checkpoint.selective_ac_option",
        "op",
        "--optimizer.lr",
        "1e-3",
    )
    assert cfg.training.steps == 3
    assert cfg.training.compile is True
    assert cfg.metrics.enable_tensorboard is False
    assert cfg.float8.filter_fqns == ["output", "layers.0"]
    assert cfg.training.seed is None
    assert cfg.activation_checkpoint.selective_ac_option == "op"
    assert cfg.optimizer.lr == 1e-3


def test_bare_preset_name_resolves():
    cfg = load("--config", "llama_8b.toml")
    assert cfg.model.flavor == "8B"
    assert cfg.job.config_file.endswith("train_configs/llama_8b.toml")


def test_every_preset_loads():
    """Every key a preset writes is the value the job runs with (none dropped or renamed on the
    way), and its model is a valid one of its family."""
    import tomllib

    from titanlite.families import model_args

    presets = sorted((ROOT / "train_configs").glob("*.toml"))
    assert len(presets) >= 4, presets
    for preset in presets:
        cfg = load("--config", str(preset))
        written = tomllib.loads(preset.read_text())
        assert {"job", "model", "training", "parallelism"} <= set(written), preset.name
        for section, keys in written.items():
            for key, value in keys.items():
                got = getattr(getattr(cfg, section), key)
                assert got == value, (preset.name, section, key, value, got)
        model_args(cfg, vocab_size=128256, bos_id=0).check()


def test_pyproject_lists_every_package():
    """pyproject.toml lists the packages (a `find` cannot see titanlite.presets, which is
    train_configs/ installed in the package): one left out would be missing from the wheel."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {
        ".".join(d.relative_to(ROOT).parts)
        for top in ("titanlite", "models", "parallelisms")
        for d in [ROOT / top, *(ROOT / top).rglob("*")]
        if (d / "__init__.py").is_file()
    }
    assert sorted(setuptools["packages"]) == sorted(found | {"titanlite.presets"})
    assert setuptools["package-dir"] == {"titanlite.presets": "train_configs"}
    assert setuptools["package-data"]["titanlite.presets"] == ["*.toml"]


def test_pyproject_admits_only_the_tested_torch_and_torchao():
    """A range wider than what CI runs resolved a fresh `pip install -e .` to torch 2.14.1,
    which nothing had tested (issue 46): the pins admit the installed (tested) releases, the
    default of scripts/ensure_installed.sh, and not the next minor release."""
    import re
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement
    from packaging.version import Version

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    reqs += [Requirement(r) for r in project["optional-dependencies"]["float8"]]
    spec = {r.name: r.specifier for r in reqs}
    for name in ("torch", "torchao"):
        tested = Version(version(name)).base_version
        major, minor = Version(tested).release[:2]
        assert tested in spec[name], (name, tested, spec[name])
        assert f"{major}.{minor + 1}.0" not in spec[name], (name, spec[name])
        assert f"{major}.{minor}.0" in spec[name] and f"{major}.{minor - 1}.0" not in spec[name]
    script = (ROOT / "scripts" / "ensure_installed.sh").read_text()
    default = re.search(r"TITANLITE_TORCH_SPEC:-torch==([\d.]+)", script)
    assert default and default.group(1) in spec["torch"]


TORCHTITAN_LLAMA3_8B = """
[job]
dump_folder = "./outputs"
description = "Llama 3 8B training"

[profiling]
enable_profiling = true
save_traces_folder = "profile_trace"
profile_freq = 100

[metrics]
log_freq = 10
enable_tensorboard = true
save_tb_folder = "tb"

[model]
name = "llama3"
flavor = "8B"
tokenizer_path = "./assets/tokenizer/original/tokenizer.model"
# converters = ["float8"]

[optimizer]
name = "AdamW"
lr = 3e-4
eps = 1e-8

[lr_scheduler]
warmup_steps = 200

[training]
local_batch_size = 1
seq_len = 8192
max_norm = 1.0
steps = 1000
compile = false
dataset = "c4"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 1
pipeline_parallel_degree = 1
context_parallel_degree = 1

[checkpoint]
enable_checkpoint = false
folder = "checkpoint"
interval = 500
last_save_model_weights_only = false
export_dtype = "float32"
async_mode = "disabled"

[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"

[float8]
enable_fsdp_float8_all_gather = false
precompute_float8_dynamic_scale_for_fsdp = false
filter_fqns = ["output"]

[validation]
enabled = false
"""


def test_torchtitan_toml_loads_unchanged(tmp_path):
    toml = tmp_path / "llama3_8b.toml"
    toml.write_text(TORCHTITAN_LLAMA3_8B)
    cfg = load("--config", str(toml))
    assert (cfg.model.flavor, cfg.training.seq_len, cfg.activation_checkpoint.mode) == (
        "8B",
        8192,
        "selective",
    )


@pytest.mark.parametrize(
    "toml, argv, expected",
    [
        (
            "[training]\nstepz = 3\n",
            [],
            "unknown key 'stepz' in [training] (did you mean 'steps'?)",
        ),
        ("[trainig]\nsteps = 3\n", [], "unknown section [trainig] (did you mean 'training'?)"),
        ("[training]\nsteps = 'many'\n", [], "[training] steps = 'many': expected an integer"),
        ("[training]\nsteps = -4\n", [], "[training] steps = -4: must be >= 1"),
        ("", ["--training.seq_len", "1.5"], "[training] seq_len = '1.5': expected an integer"),
        (
            "",
            ["--optimizer.implementation", "fast"],
            "expected one of 'fused', 'foreach', 'for-loop'",
        ),
        ("", ["--parallelism.enable_compiled_autograd", "true"], "not supported by titanlite yet"),
        (
            "[validation]\nenabled = true\n",
            [],
            "[validation] enabled = true needs validation.dataset_path",
        ),
        ("", ["--validation.steps", "0"], "[validation] steps = 0: expected -1"),
        (
            "",
            ["--validation.seq_len", "4096", "--training.seq_len", "2048"],
            "[validation] seq_len = 4096 is longer than training.seq_len = 2048",
        ),
        (
            "",
            ["--training.global_batch_size", "12", "--training.local_batch_size", "8"],
            "global_batch_size = 12 is not a multiple of local_batch_size = 8",
        ),
        ("", ["--lr_scheduler.decay_ratio", "1.5"], "decay_ratio = 1.5: must be within [0, 1]"),
        (
            "",
            ["--activation_checkpoint.memory_budget", "1.5"],
            "[activation_checkpoint] memory_budget = 1.5: must be <= 1.0",
        ),
        (
            "",
            ["--activation_checkpoint.mode", "memory_budget"],
            "mode = 'memory_budget' is torch.compile's choice of what to recompute and needs "
            "training.compile = true",
        ),
        ("[training\n", [], "not valid TOML"),
        ("", ["--training.steps"], "--training.steps needs a value"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, toml, argv, expected):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as e:
        load("--config", str(path), *argv)
    assert expected in str(e.value)
    assert "\n" not in str(e.value)


def _preflight(*argv: str, world_size: int = 1) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "titanlite.preflight", *argv],
        cwd=ROOT,
        env=clean_env(WORLD_SIZE=str(world_size)),
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--training.steps", "x"], "[training] steps = 'x': expected an integer"),
        (["--model.flavor", "9B"], "flavor = '9B': unknown for llama3"),
        (
            ["--model.tokenizer_path", "/nonexistent/tokenizer.json"],
            "/nonexistent/tokenizer.json does not exist",
        ),
        (["--training.dataset_path", "/nonexistent/data"], "/nonexistent/data does not exist"),
        (["--training.dataset", "c4"], "training.dataset = 'c4' is not built in"),
        (["--model.n_heads", "7"], "dim = 256 is not divisible by n_heads = 7"),
        (
            ["--training.enable_cpu_offload"],
            "enable_cpu_offload moves GPU memory to the host and needs CUDA",
        ),
        (
            ["--profiling.enable_memory_snapshot"],
            "enable_memory_snapshot records the CUDA caching allocator",
        ),
        (["--parallelism.tensor_parallel_degree", "3"], "world size 1 is not divisible"),
    ],
)
def test_preflight_exit_code_2_one_line(argv, expected, monkeypatch, capsys):
    # In process (a subprocess per case costs seconds of imports); the real process's exit code
    # and the absence of a traceback are checked once below.
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert preflight.main(["--config", str(DEBUG_CONFIG), *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("titanlite: error: ") and expected in lines[0], lines[0]


def test_validation_seq_len_must_split_over_tp(monkeypatch, capsys, tmp_path):
    # Validation batches go through the same sequence-parallel blocks as training ones.
    (tmp_path / "val.txt").write_text("held-out text " * 200)
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = ["--config", str(DEBUG_CONFIG), "--parallelism.tensor_parallel_degree", "2"]
    argv += ["--validation.enabled", "--validation.dataset_path", str(tmp_path / "val.txt")]
    assert preflight.main([*argv, "--validation.seq_len", "63"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "titanlite: error: validation.seq_len = 63 is not divisible by tensor_parallel_degree = 2 "
        "(sequence parallel splits the sequence over the tp ranks)"
    ]
    assert preflight.main([*argv, "--validation.seq_len", "64"]) == 0, capsys.readouterr().err


def test_preflight_process_exits_2_without_traceback(tmp_path):
    (tmp_path / "a.txt").write_text("")
    proc = _preflight("--config", str(DEBUG_CONFIG), "--training.dataset_path", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("titanlite: error: ") and "every file is empty" in lines[0]


def test_preflight_of_a_fresh_start_imports_no_parallelism_or_checkpoint_engine(tmp_path):
    # Every launch pays preflight's imports once more: FSDP, DTensor, pipelining and DCP cost
    # ~2.7 s of its ~5 s, and a fresh single-layout start needs none of them.
    heavy = [
        "torch.distributed.fsdp",
        "torch.distributed.pipelining",
        "torch.distributed.checkpoint",
    ]
    code = (
        "import sys; from titanlite.preflight.checks import main; "
        f"code = main(['--config', {str(DEBUG_CONFIG)!r}, '--job.dump_folder', {str(tmp_path)!r}]); "
        f"print(code, [m for m in {heavy!r} if m in sys.modules])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=clean_env(WORLD_SIZE="1"),
        capture_output=True,
        text=True,
    )
    assert proc.stdout.split("\n")[-2] == "0 []", proc.stdout + proc.stderr


def test_run_train_reports_config_error_before_launch():
    proc = subprocess.run(
        ["bash", "run_train.sh", "--training.stepz", "3"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "titanlite: error: command line (--training.stepz): unknown key 'stepz' in [training] "
        "(did you mean 'steps'?)"
    )
    assert "Traceback" not in proc.stderr


def test_print_config_roundtrips(tmp_path):
    cfg = load("--config", str(DEBUG_CONFIG), "--training.steps", "11")
    out = tmp_path / "resolved.toml"
    out.write_text(config.to_toml(cfg))
    again = load("--config", str(out))
    assert again.training == cfg.training and again.model == cfg.model


def test_config_reference_doc_is_current():
    proc = subprocess.run(
        [sys.executable, "scripts/gen_config_docs.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


def test_old_torch_and_missing_packages_are_one_line_errors(monkeypatch):
    import builtins

    import torch

    from titanlite.core.errors import EnvironmentProblem
    from titanlite.preflight.checks import check_environment

    job = load("--config", str(DEBUG_CONFIG))
    monkeypatch.setattr(torch, "__version__", "2.5.1+cu121")
    with pytest.raises(
        EnvironmentProblem, match=r"torch 2.5.1\+cu121 is older than the minimum 2.7"
    ):
        check_environment(job)
    monkeypatch.undo()
    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name == "tensorboard":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(EnvironmentProblem, match="pip install tensorboard"):
        check_environment(job)
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "wandb", None)  # find_spec: as if not installed
    job = load("--config", str(DEBUG_CONFIG), "--metrics.enable_wandb")
    with pytest.raises(EnvironmentProblem, match=r"pip install 'titanlite\[wandb\]'"):
        check_environment(job)


def test_an_earlier_different_config_is_kept_never_overwritten(tmp_path):
    for text in ("a = 1\n", "a = 2\n", "a = 3\n"):
        config.save_resolved(tmp_path, text)
        os.utime(tmp_path / "config.toml", (1_000_000, 1_000_000))  # all within one second
    config.save_resolved(tmp_path, "a = 3\n")  # the same config again: nothing to keep
    kept = sorted(p.read_text() for p in tmp_path.glob("config.*.toml"))
    assert kept == ["a = 1\n", "a = 2\n"]
    assert (tmp_path / "config.toml").read_text() == "a = 3\n"
    assert not list(tmp_path.glob("*.tmp"))


def test_a_choice_named_none_is_that_choice_not_unset():
    """`[model] moe_load_balance` is optional (unset: the flavor's) and one of its choices is
    "none": the CLI's `none` chooses no balancing; the CLI's `none` of an optional number still
    unsets it."""
    moe = ["--config", "qwen3_moe_debug.toml"]
    assert config.load([*moe, "--model.moe_load_balance", "none"]).model.moe_load_balance == "none"
    assert config.load(moe).model.moe_load_balance == "aux_loss"  # the preset's
    assert config.load([*moe, "--model.moe_aux_loss_coef", "none"]).model.moe_aux_loss_coef is None
