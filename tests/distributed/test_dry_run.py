"""The dry run: the real layout code on meta tensors under a fake process group."""

import json
import subprocess

import pytest
from helpers import DEBUG_CONFIG, ROOT, clean_env, dry_run, spawn
from state_bytes_worker import write_state_bytes

from titanlite.config import loader as config
from titanlite.planning.dry_run import plan
from titanlite.planning.headroom import NCCL_COMMUNICATOR

QWEN3_MOE = ["--model.name", "qwen3", "--model.flavor", "debugmodel_moe"]


def _shell(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "run_train.sh", *argv],
        cwd=ROOT,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _dry(*argv: str) -> subprocess.CompletedProcess:
    """The plan as `./run_train.sh --dry-run` prints it, made in this process (the shell's own
    path is proven by test_run_train_sh_dry_run_plans_and_refuses_like_a_launch)."""
    return dry_run(*argv)


@pytest.mark.parametrize(
    "preset, world, mesh",
    [
        ("llama_8b.toml", 64, "dp_shard=64"),
        ("llama_70b.toml", 256, "dp_shard=32 x tp=8"),
        ("llama_405b.toml", 128, "dp_shard=16 x tp=8"),
    ],
)
def test_presets_plan_quickly(preset, world, mesh):
    proc = _dry("--config", preset, "--dry-run.world_size", str(world))
    assert proc.returncode == 0, proc.stderr
    assert f"mesh                 {mesh}" in proc.stdout
    assert "FITS" in proc.stdout
    seconds = float(proc.stdout.split("planned in ")[1].split("s")[0])
    assert seconds < 60


# 128k-token sequences as a long-context run would train them: context parallel over 8 ranks,
# one sequence per data-parallel rank, full activation checkpointing (docs/dry_run.md).
LONG_CONTEXT = [
    "--training.seq_len",
    "131072",
    "--training.local_batch_size",
    "1",
    "--activation_checkpoint.mode",
    "full",
]


@pytest.mark.parametrize(
    "preset, world, mesh",
    [
        ("llama_8b.toml", 64, "dp_shard=8 x cp=8"),
        ("llama_70b.toml", 256, "dp_shard=4 x cp=8 x tp=8"),
    ],
)
def test_context_parallel_plans_at_128k_tokens(preset, world, mesh):
    cp8 = [*LONG_CONTEXT, "--parallelism.context_parallel_degree", "8"]
    proc = _dry("--config", preset, "--dry-run.world_size", str(world), *cp8)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"mesh                 {mesh}" in out
    assert (
        "context parallel     8 ranks share each sequence (headtail cut): 16,384 tokens per rank "
        "of the micro-batch's 131,072"
    ) in out
    assert "-> FITS" in out
    assert float(out.split("planned in ")[1].split("s")[0]) < 60
    # Against the same job without context parallel: what is proportional to this rank's
    # tokens (each checkpointed block's input, the final norm, the logits and their gradient)
    # shrinks 8 times. The preset's attn_type "auto" runs the per-document kernel, which builds
    # no mask with or without cp; with cp it adds the int64 key rows of its pieces
    # (seq x (1 + 1/16) at cp 8) and this rank's rows of the RoPE table.
    with_cp = plan(config.load(["--config", preset, *cp8]), world)
    without = plan(config.load(["--config", preset, *LONG_CONTEXT]), world)
    assert with_cp.cp == 8 and without.cp == 1
    assert with_cp.tokens_per_rank * 8 == without.tokens_per_rank == 131072
    rows = 8 * 131072 * 17 // 16 + 16384 * 64 * 8  # head_dim 128: 64 complex64 per RoPE row
    saved = "activations (saved)"
    assert with_cp.bytes[saved] - rows == pytest.approx(without.bytes[saved] / 8, rel=1e-6)
    # The recomputed block keeps the whole sequence's keys and values (all-gathered), so it
    # shrinks less than 8 times.
    recompute = "activations (recompute + loss grad)"
    assert without.bytes[recompute] / 8 < with_cp.bytes[recompute]
    assert with_cp.bytes[recompute] < without.bytes[recompute] / 2


@pytest.mark.parametrize(
    "preset, world, degrees, mesh, stages",
    [
        ("llama_70b.toml", 128, ["4", "8"], "pp=4 x dp_shard=4 x tp=8", 4),
        ("llama_405b.toml", 512, ["8", "8"], "pp=8 x dp_shard=8 x tp=8", 8),
    ],
)
def test_pipeline_plans_show_every_stage(preset, world, degrees, mesh, stages):
    proc = _dry(
        "--config",
        preset,
        "--dry-run.world_size",
        str(world),
        "--parallelism.pipeline_parallel_degree",
        degrees[0],
        "--parallelism.tensor_parallel_degree",
        degrees[1],
        "--training.local_batch_size",
        "8",
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"mesh                 {mesh}" in out and "bubble" in out
    rows = out.split("per pipeline stage (GiB):")[1].strip().splitlines()[1:]
    assert [int(r.split()[0]) for r in rows] == list(range(0, world, world // stages))
    activations = [float(r.split()[2]) for r in rows]
    # 1F1B: the first stage holds the most micro-batches in flight, so the most activations
    # of the stages that do not compute the loss.
    assert activations[0] == max(activations[:-1])
    assert f"in flight            {stages} (micro-batch, stage)" in out  # rank 0: pp forwards


def test_memory_budget_plan_lies_between_full_and_no_checkpointing():
    # Llama 3 8B on 8 ranks at the default budget 0.5: the saved block activations are planned
    # halfway from full checkpointing's to none's (titanlite/planning/activation_memory.py), the rest of
    # the plan is unchanged, and the plan says which budget it assumed.
    base = ["--config", "llama_8b.toml", "--training.compile", "--activation_checkpoint.mode"]
    plans = {m: plan(config.load([*base, m]), 8) for m in ("full", "memory_budget", "none")}
    assert "activation memory    budget 0.5 (compiled min-cut)" in plans["memory_budget"].render()
    saved = {m: p.bytes["activations (saved)"] for m, p in plans.items()}
    assert saved["memory_budget"] == pytest.approx((saved["full"] + saved["none"]) / 2, abs=32)
    for key in ("parameters", "gradients", "optimizer", "FSDP unsharded params/grads"):
        assert plans["memory_budget"].bytes[key] == plans["full"].bytes[key]


def test_qwen3_30b_a3b_plan_lists_the_moe_terms():
    # The preset on 64 ranks (FSDP 64, no expert parallel), printed as ./run_train.sh prints it,
    # then the same job without checkpointing, where every layer keeps its MoE activations.
    proc = _dry("--config", "qwen3_30b_a3b.toml", "--dry-run.world_size", "64")
    assert proc.returncode == 0, proc.stderr
    assert "mesh                 dp_shard=64" in proc.stdout and "-> FITS" in proc.stdout
    assert "counted on the 3.35B parameters a token activates" in proc.stdout
    assert "of which Mixture of Experts (128 experts, 8 per token" in proc.stdout
    job = config.load(["--config", "qwen3_30b_a3b.toml", "--activation_checkpoint.mode", "none"])
    p = plan(job, 64)
    args, tokens, e = job.model, 4 * 4096, 2  # local batch 4 x seq 4096, bf16
    layers, k, dim, hidden, experts = 48, 8, 2048, 768, 128
    # Expert weights: fp32 parameter, gradient and AdamW's two moments, sharded 64 ways (each
    # rank 2 of the 128 experts), plus AdamW's step counters.
    expert_numel = layers * experts * 3 * dim * hidden
    assert 0 <= p.moe["expert weights + grads + optimizer"] - 16 * expert_numel // 64 < 2**10
    assert p.moe["router weights + grads + optimizer"] > 0
    # Without checkpointing every layer keeps its sorted token copies, expert outputs and their
    # weighted copies (3 e k dim), the slots' weights and the sort's indices.
    dispatch = layers * tokens * (3 * e * k * dim + e * k + 16 * k)
    assert p.moe["dispatch buffers (token copies)"] == dispatch
    assert p.moe["grouped-GEMM activations"] == layers * (tokens * 4 * e * k * hidden + 4 * experts)
    moe_activations = sum(v for n, v in p.moe.items() if "activations" in n or "dispatch" in n)
    assert moe_activations < p.bytes["activations (saved)"]
    assert args.flavor == "30B-A3B"


def test_qwen3_30b_a3b_under_tensor_parallel_gathers_whole_experts():
    # Tensor parallel runs the MoE on the sequence shard with its experts replicated over tp
    # (parallelisms/moe_tp.py): half the tokens' MoE activations per rank, but FSDP gathers
    # every expert whole on each tp rank (a 1/tp planned before: 3.19 instead of 6.01 GiB).
    base = ["--config", "qwen3_30b_a3b.toml"]
    one, two = (
        plan(config.load([*base, "--parallelism.tensor_parallel_degree", str(tp)]), 64)
        for tp in (1, 2)
    )
    for row in ("dispatch buffers (token copies)", "grouped-GEMM activations"):
        assert two.moe[row] * 2 == pytest.approx(one.moe[row], rel=1e-6)  # + the group ends
    unsharded = "FSDP unsharded params/grads"
    assert 0.9 * one.bytes[unsharded] < two.bytes[unsharded] < one.bytes[unsharded]


def test_expert_parallel_plans_30b_a3b_and_235b_a22b_beside_the_same_models_without_it():
    """30B-A3B on 64 ranks with EP 8 x efsdp 8, 235B-A22B on 256 with EP 16 x efsdp 16 (and
    with PP 4), each against the same model without EP: the same expert states per rank (the
    experts are spread over all ranks either way), less gathered by FSDP (a rank gathers its
    own experts only), and the all-to-all's buffers, balanced in the total and the worst routing
    beside it with its own verdict."""
    cases = {
        "30b": (["--config", "qwen3_30b_a3b.toml"], 64, 8, 8),
        "235b": (["--config", "qwen3_30b_a3b.toml", "--model.flavor", "235B-A22B"], 256, 16, 16),
        "235b_pp4": (
            [
                "--config",
                "qwen3_30b_a3b.toml",
                "--model.flavor",
                "235B-A22B",
                "--parallelism.pipeline_parallel_degree",
                "4",
            ],
            256,
            16,
            4,
        ),
    }
    for name, (argv, world, ep, efsdp) in cases.items():
        ep_flag = ["--parallelism.expert_parallel_degree", str(ep)]
        without, with_ep = (
            plan(config.load(argv), world),
            plan(config.load([*argv, *ep_flag]), world),
        )
        assert with_ep.seconds < 30, (name, with_ep.seconds)
        a2a = with_ep.all_to_all
        assert a2a is not None and without.all_to_all is None
        assert (a2a.ep, a2a.efsdp, a2a.local_experts) == (ep, efsdp, 128 // ep), name
        assert f"EP {ep}, {128 // ep} per rank" in with_ep.moe_note
        states = "expert weights + grads + optimizer"
        assert with_ep.moe[states] <= without.moe[states], name  # (FSDP pads 128 rows to 256)
        unsharded = "FSDP unsharded params/grads"
        assert with_ep.bytes[unsharded] < without.bytes[unsharded], name
        # One layer's send and receive buffers: the rank's tokens' k copies each way, bf16.
        tokens = 4 * 4096 // (1 if "pp4" not in name else 4)  # micro-batch under PP: 1 of 4
        dim = 2048 if name == "30b" else 4096
        assert a2a.balanced == 2 * tokens * 8 * dim * 2, name
        assert with_ep.bytes["all-to-all buffers (EP, balanced)"] == a2a.balanced
        assert a2a.worst > a2a.balanced
        text = with_ep.render()
        assert f"EP {ep} x efsdp {efsdp}: {128 // ep} experts per rank" in text, text
        worst = with_ep.total - a2a.balanced + a2a.worst
        verdict = "FITS" if worst <= with_ep.device_memory - with_ep.headroom else "DOES NOT FIT"
        assert f"-> total {worst / 2**30:.2f} GiB, {verdict}" in text, text


def test_float8_plan_builds_the_nccl_only_paths():
    # Float8 TP styles and the FSDP float8 weight wrapper need NCCL to run; planning for a GPU
    # cluster builds them on meta tensors, which is as far as a CPU machine can take them.
    proc = _dry(
        "--config",
        "llama_8b.toml",
        "--dry-run.world_size",
        "64",
        "--parallelism.tensor_parallel_degree",
        "8",
        "--model.converters",
        "float8",
        "--float8.enable_fsdp_float8_all_gather",
        "true",
        "--float8.precompute_float8_dynamic_scale_for_fsdp",
        "true",
    )
    assert proc.returncode == 0, proc.stderr
    for line in (
        "float8: converting 224 of 225 Linear layers",
        "FSDP all-gathers weights in float8, scales precomputed after each step",
        "TP all-gathers activations in float8",
        "FITS",
    ):
        assert line in proc.stdout


def test_run_train_sh_dry_run_plans_and_refuses_like_a_launch():
    """Through run_train.sh: a preset named bare plans, and an impossible layout is the same
    one-line error (exit 2) as a real launch's."""
    proc = _shell("--dry-run", "--config", "llama_8b.toml", "--dry-run.world_size", "64")
    assert proc.returncode == 0, proc.stderr
    assert "mesh                 dp_shard=64" in proc.stdout and "FITS" in proc.stdout
    proc = _shell("--dry-run", "--config", "llama_70b.toml", "--dry-run.world_size", "100")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "titanlite: error: world size 100 is not divisible by data_parallel_replicate_degree (1) "
        "x tensor_parallel_degree (8); change the degrees or the number of processes (NGPU)"
    )
    bad = ["--config", str(DEBUG_CONFIG), "--parallelism.tensor_parallel_degree", "3"]
    dry = _shell("--dry-run", *bad, "--dry-run.world_size", "6")
    real = _shell(*bad, NGPU="6")
    assert dry.returncode == real.returncode == 2
    assert dry.stderr.strip() == real.stderr.strip().splitlines()[-1]
    assert "n_heads = 16 is not divisible by parallelism.tensor_parallel_degree = 3" in dry.stderr


def test_does_not_fit_verdict():
    proc = _dry(
        "--config",
        "llama_70b.toml",
        "--dry-run.world_size",
        "8",
        "--parallelism.tensor_parallel_degree",
        "1",
    )
    assert proc.returncode == 0 and "DOES NOT FIT" in proc.stdout and "biggest item" in proc.stdout


def test_verdict_keeps_the_headroom():
    # FITS must mean "fits with room for what the plan does not count" (the CUDA context and
    # NCCL's buffers): a plan 0.5 GiB under the device size does not fit one process's 1 GiB
    # (no NCCL communicator: a world of one has no peer), nor 4 GiB under it an explicit 8 GiB.
    job = config.load(["--config", str(DEBUG_CONFIG)])
    total_gib = plan(job, 1).total / 2**30
    assert plan(job, 1, device_memory_gib=total_gib + 0.5, headroom_gib=0).fits
    tight = plan(job, 1, device_memory_gib=total_gib + 0.5)
    assert tight.headroom == 2**30 and not tight.fits
    assert plan(job, 1, device_memory_gib=total_gib + 1.5).fits
    assert not plan(job, 1, device_memory_gib=total_gib + 4, headroom_gib=8).fits
    proc = _dry("--config", str(DEBUG_CONFIG), "--dry-run.device_memory_gib", "141")
    assert proc.returncode == 0, proc.stderr
    assert "GiB of 140 GiB usable (141 GiB device - 1 GiB headroom)  -> FITS" in proc.stdout
    assert "headroom: CUDA context 1.00 GiB + 0 NCCL communicator(s)" in proc.stdout
    proc = _dry("--config", str(DEBUG_CONFIG), "--dry-run.headroom_gib", "8")
    assert "GiB of 72 GiB usable (80 GiB device - 8 GiB headroom)" in proc.stdout
    assert "headroom: CUDA context" not in proc.stdout  # the user's figure, not the estimate
    proc = _dry("--config", str(DEBUG_CONFIG), "--dry-run.headroom_gib", "100")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "titanlite: error: --dry-run.headroom_gib 100 must be >= 0 and below "
        "--dry-run.device_memory_gib 80"
    )


PP4_TP8 = [
    *("--parallelism.pipeline_parallel_degree", "4", "--parallelism.tensor_parallel_degree", "8"),
    *("--training.local_batch_size", "8"),
]


@pytest.mark.parametrize(
    "preset, world, extra, communicators",
    [
        ("llama_8b.toml", 8, [], 1),  # FSDP's mesh is the whole world: the default group's
        ("llama_70b.toml", 256, [], 4),  # the default group, dp_shard, tp, the flattened dp
        ("llama_70b.toml", 128, PP4_TP8, 5),  # and pp
    ],
)
def test_headroom_is_the_cuda_context_and_each_nccl_communicator(
    preset, world, extra, communicators
):
    # The communicators are the process groups of more than one rank that the real layout
    # code creates for this rank (counted under the fake process group), each at NCCL's
    # default buffers: 32 channels x 2 peers x (Simple 4 MiB + LL128 4.6875 MiB + LL 0.5 MiB).
    job = config.load(["--config", preset, *extra])
    p = plan(job, world)
    assert NCCL_COMMUNICATOR == 588 * 2**20
    assert p.headroom == 2**30 + communicators * NCCL_COMMUNICATOR
    assert f"CUDA context 1.00 GiB + {communicators} NCCL communicator(s) x 588 MiB" in p.render()
    assert plan(job, world, device_type="cpu").headroom == 0  # gloo: no device memory


def test_fsdp_bytes_shrink_as_one_over_dp():
    job = config.load(["--config", "llama_8b.toml"])
    sizes = {w: plan(job, w).bytes for w in (8, 16, 32, 64)}
    for key in ("parameters", "gradients", "optimizer"):
        for w in (16, 32, 64):
            assert sizes[w][key] == pytest.approx(sizes[8][key] * 8 / w, rel=1e-3), (key, w)


@pytest.mark.slow
@pytest.mark.parametrize(
    "nproc, extra",
    [
        (1, ["--training.local_batch_size", "8"]),
        (2, ["--training.local_batch_size", "4"]),
        (2, ["--training.local_batch_size", "8", "--parallelism.tensor_parallel_degree", "2"]),
        (2, ["--training.local_batch_size", "8", "--parallelism.pipeline_parallel_degree", "2"]),
        # Muon: one momentum buffer per matrix, AdamW's two moments for the rest; the MoE's
        # experts' buffers split over expert parallel like their weights.
        (2, ["--training.local_batch_size", "4", "--optimizer.name", "Muon"]),
        (2, [*QWEN3_MOE, "--parallelism.expert_parallel_degree", "2", "--optimizer.name", "Muon"]),
    ],
)
def test_state_bytes_equal_a_real_gloo_run(tmp_path, nproc, extra):
    args = [
        "--config",
        str(DEBUG_CONFIG),
        "--training.seq_len",
        "64",
        "--metrics.enable_tensorboard",
        "false",
        "--job.dump_folder",
        str(tmp_path),
        *extra,
    ]
    spawn(write_state_bytes, nproc, str(tmp_path / "sizes"), args)
    job = config.load(args)
    for rank in range(nproc):
        real = json.loads((tmp_path / f"sizes.rank{rank}.json").read_text())
        predicted = plan(job, nproc, rank=rank, device_type="cpu").bytes
        for key in ("parameters", "gradients", "optimizer"):
            if key == "gradients" and "--parallelism.tensor_parallel_degree" in extra:
                # Under TP the embedding's gradient lives in a buffer larger than its shard,
                # which meta tensors do not show (measured: +2.4% of gradient bytes here).
                assert real[key] == pytest.approx(predicted[key], rel=0.03)
            else:
                assert predicted[key] == real[key], (rank, key, predicted[key], real[key])
