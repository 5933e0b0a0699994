"""Every parallel layout trains the same model: the debug model, fp32, same seed, same global
batch (8 sequences), 5 steps through the trainer's own loop and step; every step's loss and
gradient norm, every parameter's gradient of step 1 (within 1e-4 relative, in norm, none lost)
and the final weights must equal the single-process run's within 1e-4, compiled layouts
included. All layouts of one world size train one after another in one process group
(trainer_jobs_worker.py), each with its own dump folder.

The debug preset's block_causal masking is on, over the bundled corpus cut into paragraphs (the
corpus's files are ~2,000-token documents, which 5 steps of 8 x 64 tokens would cross once or
twice): 3 to 7 boundaries per step of 8 windows, 0 to 2 per window, so the ranks and
micro-batches count different numbers of targets and the mask differs from causal on every
layout.

Which file proves which layout. This module keeps what only the trainer's loop shows (gradient
accumulation and its sync-once variant, pipeline schedules with micro-batch sizes and CSV
actions, memory-budget AC, per-document RoPE under SP and CP, the token counts that differ
between ranks under documents, the 3-D PP x FSDP x TP case) and one representative of each
parallelism (FSDP, DDP, HSDP, TP, CP, PP, AC, compile). test_grad_parity.py proves, with one
forward/backward per layout, the layouts not repeated here: FSDP 4, TP 4, TP 2 without loss
parallel, FSDP 2 x TP 2 (plain, accumulation, full and op AC, float8),
CP 2 compiled, FSDP 2 compiled, PP 2 with
Interleaved1F1B and ZBVZeroBubble, PP 2 x FSDP 2, PP 2 x TP 2, CP 2 and CP 4 with documents (CP 2
also through masked SDPA), CP 2 contiguous, CP 2 x FSDP 2, CP 2 x HSDP, CP 2 x TP 2 (with op AC)
and PP 2 x CP 2. Both tests also check what parity cannot see: every block compiled where
compile is on, and the positions each cp rank holds. test_checkpoint.py resumes and
reshards across one process, FSDP 2, TP 2, CP 2 and FSDP 2 x TP 2; test_float8_training.py
trains float8 under FSDP 2 and FSDP 2 x TP 2. bfloat16 mixed precision (FSDP 2, FSDP 2 x TP 2)
is compared with one process under bf16 autocast at bounds measured and explained below."""

import json

import pytest
import torch
from helpers import DEBUG_CONFIG, MUON, NO_EVAL, ROOT, TWO_BLOCKS
from trainer_jobs import TrainerJobs

STEPS = 5
COMMON = [
    "--config",
    str(DEBUG_CONFIG),
    *TWO_BLOCKS,
    "--training.steps",
    str(STEPS),
    "--training.seq_len",
    "64",
    "--metrics.enable_tensorboard",
    "false",
    "--metrics.log_freq",
    "1",
    "--training.mixed_precision_param",
    "float32",
    "--training.deterministic",
    *NO_EVAL,
]
LBS = "--training.local_batch_size"
TP, CP, PP, EP = (
    f"--parallelism.{k}_parallel_degree" for k in ("tensor", "context", "pipeline", "expert")
)
HSDP2 = ["--parallelism.data_parallel_replicate_degree", "2"]
PP_SCHEDULE = "--parallelism.pipeline_parallel_schedule"
ACCUM2 = ["--training.global_batch_size", "8"]
AC_FULL = ["--activation_checkpoint.mode", "full"]
ROPE_DOCUMENT = ["--model.rope_positions", "document"]
QWEN3 = ["--model.name", "qwen3"]  # its debugmodel: per-head q/k norms, head_dim apart from dim
QWEN3_MOE = [*QWEN3, "--model.flavor", "debugmodel_moe"]  # 8 experts, 2 per token, aux loss
QWEN3_MOE_BIAS = [*QWEN3_MOE, "--model.moe_load_balance", "expert_bias"]
QWEN3_MOE_BIAS += ["--model.moe_bias_update_rate", "0.01"]
QWEN3_TIED = [*QWEN3, "--model.flavor", "debugmodel_tied"]  # the head is the embedding
# Its debugmodel: MLA (query latent, values narrower than keys), block 0 dense and block 1
# DeepSeekMoE (8 experts in 4 groups, 2 from the 2 best, a shared expert, the expert bias and
# the sequence-wise loss), one MTP module (an MoE block of its own) whose loss is in the objective.
DEEPSEEK = ["--model.name", "deepseek_v3", "--model.moe_bias_update_rate", "0.01"]
DEEPSEEK_NO_MTP = [*DEEPSEEK, "--model.mtp_depth", "0"]  # pipeline parallel

# name -> (processes, overrides); local batch x data-parallel degree x accumulation = 8.
LAYOUTS = {
    "one": (1, [LBS, "8"]),  # the reference
    "one_proc_accum2": (1, [LBS, "4", *ACCUM2]),
    "fsdp2": (2, [LBS, "4"]),
    "ddp2": (2, [LBS, "4", "--parallelism.data_parallel_replicate_degree", "2"]),
    "tp2": (2, [LBS, "8", TP, "2"]),
    # Per-document RoPE positions: under block_causal the same function as window positions
    # (RoPE scores depend on position differences, which stay within a document), so the
    # one-process window run is its reference too. What this checks: under sequence parallel
    # every rank computes the positions from the whole, replicated tokens.
    "tp2_rope_document": (2, [LBS, "8", TP, "2", *ROPE_DOCUMENT]),
    # Gradient accumulation: 2 micro-batches of 2 per rank on 2 ranks = the same 8 sequences.
    "fsdp2_accum2": (2, [LBS, "2", *ACCUM2]),
    "fsdp2_accum2_sync_once": (
        2,
        [LBS, "2", *ACCUM2, "--parallelism.fsdp_sync_grads_each_microbatch", "false"],
    ),
    # Pipeline parallel (torch.distributed.pipelining), 8 sequences in pipeline micro-batches.
    "pp2_1f1b": (2, [LBS, "8", PP, "2"]),
    "pp2_gpipe": (
        2,
        [
            LBS,
            "8",
            PP,
            "2",
            PP_SCHEDULE,
            "GPipe",
            "--parallelism.pipeline_parallel_microbatch_size",
            "2",
        ],
    ),
    # A schedule given as a CSV of actions (GPipe order, 2 micro-batches of 4).
    "pp2_csv": (
        2,
        [
            LBS,
            "8",
            PP,
            "2",
            "--parallelism.pipeline_parallel_microbatch_size",
            "4",
            "--parallelism.pipeline_parallel_schedule_csv",
            str(ROOT / "tests" / "fixtures" / "pipeline" / "gpipe_2_ranks_2_microbatches.csv"),
        ],
    ),
    # The one compiled pipeline case (compile costs ~15 s per graph on CPU).
    "pp2_compile": (2, [LBS, "8", PP, "2", "--training.compile"]),
    # Tensor parallel compiled without FSDP: refused by preflight until the embedding's
    # reduce-scatter was made to finish before the first compiled block (docs/parallelism.md).
    "tp2_compile": (2, [LBS, "8", TP, "2", "--training.compile"]),
    # Context parallel under block_causal documents: at seq 64 the head-tail cut makes chunks
    # of 16 tokens (8 under CP 4) and the paragraphs are longer, so documents straddle the
    # chunk borders (and the ranks' borders) in every window.
    "cp2": (2, [LBS, "8", CP, "2"]),
    "cp2_ac_full": (2, [LBS, "8", CP, "2", *AC_FULL]),
    "hsdp2x2": (4, [LBS, "2", "--parallelism.data_parallel_replicate_degree", "2"]),
    # With per-document RoPE positions, computed from the whole window before the cut.
    "cp4_rope_document": (4, [LBS, "8", CP, "4", *ROPE_DOCUMENT]),
    # Compile chooses what each block recomputes under a budget strictly between 0 and 1, where
    # the partitioner weighs every graph input (the TP graphs' device mesh and process group too).
    "fsdp2_tp2_memory_budget": (
        4,
        [
            LBS,
            "4",
            TP,
            "2",
            "--training.compile",
            "--activation_checkpoint.mode",
            "memory_budget",
            "--activation_checkpoint.memory_budget",
            "0.3",
        ],
    ),
    "pp2_fsdp2_ac": (4, [LBS, "4", PP, "2", *AC_FULL]),
    "pp2_fsdp2_tp2": (8, [LBS, "4", PP, "2", TP, "2"]),
    # Stages without a block, or fewer than layers_per_stage asks (issue 31), each against one
    # process of its own shape: embedding + block 0 | block 1 + output (ceil((2 + 1 + 1) / 3)
    # = 2 stages, as TorchTitan counts), and embedding + block 0 | the output alone.
    "pp2_2blocks_layers_per_stage_3": (
        2,
        [LBS, "8", PP, "2", "--parallelism.pipeline_parallel_layers_per_stage", "3"],
    ),
    "one_1block": (1, [LBS, "8", "--model.n_layers", "1"]),
    "pp2_1block": (2, [LBS, "8", PP, "2", "--model.n_layers", "1"]),
    # Qwen3 dense, and with the head tied to the embedding (one FSDP unit with it).
    "qwen3_one": (1, [LBS, "8", *QWEN3]),
    "qwen3_fsdp2": (2, [LBS, "4", *QWEN3]),
    # Compiled on 2 ranks rather than under FSDP 2 x TP 2 (fsdp2_tp2_memory_budget compiles
    # that), where 4 processes' compiles share the suite's 2 cores.
    "qwen3_tp2_compile": (2, [LBS, "8", TP, "2", "--training.compile", *QWEN3]),
    "qwen3_pp2": (2, [LBS, "8", PP, "2", *QWEN3]),
    "qwen3_cp2": (2, [LBS, "8", CP, "2", *QWEN3]),
    "qwen3_tied_one": (1, [LBS, "8", *QWEN3_TIED]),
    "qwen3_tied_fsdp2": (2, [LBS, "4", *QWEN3_TIED]),
    # Mixture of Experts: the aux loss (per sequence) over FSDP and over micro-batches; the
    # expert bias (a buffer moved from the step's global tokens-per-expert counts), which the
    # final weights include and which must be equal on every rank.
    "qwen3_moe_one": (1, [LBS, "8", *QWEN3_MOE]),
    "qwen3_moe_fsdp2": (2, [LBS, "4", *QWEN3_MOE]),
    "qwen3_moe_fsdp2_accum2": (2, [LBS, "2", *ACCUM2, *QWEN3_MOE]),
    "qwen3_moe_bias_one": (1, [LBS, "8", *QWEN3_MOE_BIAS]),
    "qwen3_moe_bias_fsdp2": (2, [LBS, "4", *QWEN3_MOE_BIAS]),
    # Under TP each rank routes its sequence shard through replicated experts: their gradients
    # and the expert counts are summed over tp, the aux loss's statistics completed over tp.
    "qwen3_moe_tp2": (2, [LBS, "8", TP, "2", *QWEN3_MOE]),
    "qwen3_moe_bias_tp2": (2, [LBS, "8", TP, "2", *QWEN3_MOE_BIAS]),
    # Pipeline stages under tensor parallel: each stage's MoE blocks with their aux losses.
    "qwen3_moe_pp2_tp2": (4, [LBS, "8", PP, "2", TP, "2", *QWEN3_MOE]),
    # The expert bias under PP: torch's shape-learning first forward must not count.
    "qwen3_moe_bias_pp2": (2, [LBS, "8", PP, "2", *QWEN3_MOE_BIAS]),
    # Context parallel: the aux loss's statistics completed over cp (and tp) as well.
    "qwen3_moe_cp2": (2, [LBS, "8", CP, "2", *QWEN3_MOE]),
    "qwen3_moe_cp2_tp2": (4, [LBS, "8", CP, "2", TP, "2", *QWEN3_MOE]),
    # Expert parallel: the experts split over ep ranks borrowed from dp_shard x cp x tp, tokens
    # sent to them and back by all-to-all; the rest of dp_shard x cp x tp shards them (efsdp).
    # EP 4 is the bias layout below (and a checkpoint's resume).
    "qwen3_moe_ep2": (2, [LBS, "4", EP, "2", *QWEN3_MOE]),
    "qwen3_moe_ep2_fsdp4_compile": (4, [LBS, "2", EP, "2", "--training.compile", *QWEN3_MOE]),
    "qwen3_moe_ep2_fsdp2_tp2": (4, [LBS, "4", EP, "2", TP, "2", *QWEN3_MOE]),
    "qwen3_moe_bias_ep4_fsdp2_tp2": (4, [LBS, "4", EP, "4", TP, "2", *QWEN3_MOE_BIAS]),
    "qwen3_moe_ep2_hsdp2x2_ac": (4, [LBS, "2", EP, "2", *HSDP2, *AC_FULL, *QWEN3_MOE]),
    "qwen3_moe_ep2_pp2": (4, [LBS, "4", EP, "2", PP, "2", *QWEN3_MOE]),
    "qwen3_moe_ep2_cp2": (2, [LBS, "8", EP, "2", CP, "2", *QWEN3_MOE]),
    # DeepSeek-V3: MLA's latents replicated over tp with the shared RoPE key's gradient summed,
    # the MTP module an FSDP unit of its own and reusing the embedding and head units, routing
    # within groups compared token by token; under CP (documents) the MTP module's attention
    # over the whole window and its targets k ahead picked across the ranks' chunks. Causal CP
    # is in test_grad_parity.py.
    "deepseek_one": (1, [LBS, "8", *DEEPSEEK]),
    "deepseek_fsdp2": (2, [LBS, "4", *DEEPSEEK]),
    "deepseek_fsdp2_compile": (2, [LBS, "4", "--training.compile", *DEEPSEEK]),
    "deepseek_tp2": (2, [LBS, "8", TP, "2", *DEEPSEEK]),
    "deepseek_ep2": (2, [LBS, "4", EP, "2", *DEEPSEEK]),
    "deepseek_fsdp2_tp2": (4, [LBS, "4", TP, "2", *DEEPSEEK]),
    "deepseek_ep4": (4, [LBS, "2", EP, "4", *DEEPSEEK]),
    "deepseek_no_mtp_one": (1, [LBS, "8", *DEEPSEEK_NO_MTP]),
    "deepseek_pp2": (2, [LBS, "8", PP, "2", *DEEPSEEK_NO_MTP]),
    "deepseek_cp2": (2, [LBS, "8", CP, "2", *DEEPSEEK]),
    # Muon: each matrix's update orthogonalized whole, whatever shards it (FSDP's Shard(0),
    # TP's rows and columns, FSDP x TP's strided rows, the experts' ep and efsdp splits of the
    # expert dimension), every rank keeping its shard of the result.
    "muon_one": (1, [LBS, "8", *MUON]),
    "muon_fsdp2": (2, [LBS, "4", *MUON]),
    "muon_fsdp2_compile": (2, [LBS, "4", "--training.compile", *MUON]),
    "muon_tp2": (2, [LBS, "8", TP, "2", *MUON]),
    "muon_pp2": (2, [LBS, "8", PP, "2", *MUON]),
    "muon_cp2": (2, [LBS, "8", CP, "2", *MUON]),
    "muon_hsdp2x2": (4, [LBS, "2", *HSDP2, *MUON]),
    "muon_fsdp2_tp2": (4, [LBS, "4", TP, "2", *MUON]),
    "qwen3_moe_muon_one": (1, [LBS, "8", *QWEN3_MOE, *MUON]),
    "qwen3_moe_muon_ep2": (2, [LBS, "4", EP, "2", *QWEN3_MOE, *MUON]),
    "qwen3_moe_muon_ep2_fsdp2_tp2": (4, [LBS, "4", EP, "2", TP, "2", *QWEN3_MOE, *MUON]),
}
# Downstream evaluation after the last step: every request's log-likelihood, on 10 examples of
# the shipped task, equal to one process's on FSDP, HSDP, TP, PP, CP, EP and a compiled layout,
# and for each family (DeepSeek-V3's MTP module left out of the forward).
EVAL = ["--eval.enabled", "--eval.log_samples", "--eval.limit", "10"]
EVAL_LAYOUTS = (
    "one",
    "fsdp2",
    "tp2",
    "pp2_1f1b",
    "cp2",
    "tp2_compile",
    "hsdp2x2",
    "qwen3_one",
    "qwen3_fsdp2",
    "qwen3_moe_one",
    "qwen3_moe_ep2",
    "deepseek_one",
    "deepseek_ep2",
)
for _name in EVAL_LAYOUTS:
    LAYOUTS[_name] = (LAYOUTS[_name][0], [*LAYOUTS[_name][1], *EVAL])
# A layout's one-process run of the same model: "one" unless named here.
REFERENCES = {
    "pp2_1block": "one_1block",
    "qwen3_fsdp2": "qwen3_one",
    "qwen3_tp2_compile": "qwen3_one",
    "qwen3_pp2": "qwen3_one",
    "qwen3_cp2": "qwen3_one",
    "qwen3_tied_fsdp2": "qwen3_tied_one",
    "qwen3_moe_pp2_tp2": "qwen3_moe_one",
    "qwen3_moe_bias_pp2": "qwen3_moe_bias_one",
    "qwen3_moe_fsdp2": "qwen3_moe_one",
    "qwen3_moe_fsdp2_accum2": "qwen3_moe_one",
    "qwen3_moe_bias_fsdp2": "qwen3_moe_bias_one",
    "qwen3_moe_tp2": "qwen3_moe_one",
    "qwen3_moe_bias_tp2": "qwen3_moe_bias_one",
    "qwen3_moe_cp2": "qwen3_moe_one",
    "qwen3_moe_cp2_tp2": "qwen3_moe_one",
    **{n: "qwen3_moe_one" for n in LAYOUTS if n.startswith("qwen3_moe_ep")},
    **{n: "qwen3_moe_bias_one" for n in LAYOUTS if n.startswith("qwen3_moe_bias_ep")},
    **{n: "deepseek_one" for n in LAYOUTS if n.startswith("deepseek_") and "_one" not in n},
    "deepseek_pp2": "deepseek_no_mtp_one",
    **{n: "muon_one" for n in LAYOUTS if n.startswith("muon_") and n != "muon_one"},
    **{n: "qwen3_moe_muon_one" for n in LAYOUTS if n.startswith("qwen3_moe_muon_ep")},
}
BF16 = ["--training.mixed_precision_param", "bfloat16"]
# bfloat16 mixed precision against one process under bf16 autocast (BF16_RTOL below says why
# the bound is what it is).
BF16_LAYOUTS = {
    "one_bf16": (1, [LBS, "8", *BF16]),  # their reference
    "fsdp2_bf16": (2, [LBS, "4", *BF16]),
    "fsdp2_tp2_bf16": (4, [LBS, "4", TP, "2", *BF16]),
}
RTOL = 1e-4
# Layouts whose steps between logs are watched for host syncs (host_syncs.py): each logs every
# third step, so steps 2 and 4 are the steps that do not log.
LOG3 = ["--metrics.log_freq", "3"]
# What the probe sees in those steps that does not make a GPU run wait, and why.
NOT_WAITING = {
    # Device tensors: on CUDA NCCL orders these all-reduces on the stream, the host goes on. (A
    # mesh group that spans the world is the default group: the token count over data-parallel
    # ranks, the loss and the squared gradient norm over pipeline stages.)
    "dist.all_reduce (world, blocking) at titanlite/trainer/trainer.py:global_sum",
    "dist.all_reduce (world, blocking) at titanlite/trainer/pipeline_step.py:share_loss",
    "dist.all_reduce (world, blocking) at titanlite/components/optim.py:clip_grad_norm_",
    # Expert parallel's exchange of the per-expert counts (a device tensor; the ep group of
    # EP 2 on 2 ranks is the world).
    "dist.all_to_all_single (world, blocking) at parallelisms/expert_parallel.py:dispatch",
    # The stop agreement's flag, a host tensor that gloo reduced in the background during the
    # previous step.
    "aten._local_scalar_dense.default at titanlite/components/preemption.py:_collect",
    # The varlen kernel's document boundaries under block_causal: one sync per forward, two
    # under context parallel (the pieces' lengths), left as they are (docs/attention.md).
    "aten.nonzero.default at models/attention.py:documents",
    "aten.nonzero.default at models/attention.py:document_pieces",
    "aten.repeat_interleave.Tensor at models/attention.py:document_pieces",
}
# The waits a layout has by design, and how many per step that does not log: expert parallel
# reads the all-to-all's split sizes on the host once per MoE layer and micro-batch (2 x 1).
DESIGNED_WAITS = {
    "qwen3_moe_ep2_syncs": ("Tensor.tolist at parallelisms/expert_parallel.py:dispatch", 2),
}
SYNC_LAYOUTS = {
    "one_syncs": (1, [LBS, "8", *LOG3]),
    "fsdp2_syncs": (2, [LBS, "4", *LOG3]),
    "ddp2_syncs": (2, [LBS, "4", "--parallelism.data_parallel_replicate_degree", "2", *LOG3]),
    "tp2_syncs": (2, [LBS, "8", TP, "2", *LOG3]),
    "cp2_syncs": (2, [LBS, "8", CP, "2", *LOG3]),
    "pp2_syncs": (2, [LBS, "8", PP, "2", *LOG3]),
    # Expert parallel reads the all-to-all's split sizes once per MoE layer and micro-batch.
    "qwen3_moe_ep2_syncs": (2, [LBS, "4", EP, "2", *QWEN3_MOE, *LOG3]),
    "fsdp2_accum2_sync_once_syncs": (
        2,
        [LBS, "2", *ACCUM2, "--parallelism.fsdp_sync_grads_each_microbatch", "false", *LOG3],
    ),
}


@pytest.fixture(scope="module")
def paragraphs(tmp_path_factory) -> str:
    """The bundled corpus, one document per paragraph, as .jsonl."""
    path = tmp_path_factory.mktemp("data") / "paragraphs.jsonl"
    corpus = ROOT / "titanlite" / "assets" / "corpus"
    with path.open("w") as f:
        for file in sorted(corpus.glob("*_*.*")):
            for paragraph in file.read_text().split("\n\n"):
                if paragraph.strip():
                    f.write(json.dumps({"text": paragraph}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def world(request, tmp_path_factory, paragraphs):
    """world(n): the selected layouts of n processes (and the reference), trained in one group
    the first time it is asked."""
    groups: dict[int, TrainerJobs] = {}
    selected = {"one"} | {
        item.callspec.params["name"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    }
    if selected & set(BF16_LAYOUTS):
        selected.add("one_bf16")
    selected |= {REFERENCES[name] for name in selected if name in REFERENCES}

    def run(nproc: int) -> TrainerJobs:
        if nproc not in groups:
            jobs = TrainerJobs(nproc, tmp_path_factory.mktemp(f"world{nproc}"))
            for name, (n, overrides) in {**LAYOUTS, **BF16_LAYOUTS, **SYNC_LAYOUTS}.items():
                if n == nproc and name in selected:
                    argv = [*COMMON, "--training.dataset_path", paragraphs, *overrides]
                    probe = name in SYNC_LAYOUTS
                    jobs.add(name, argv, record=not probe, probe=probe)
            groups[nproc] = jobs.run()
        return groups[nproc]

    return run


def _worst(got: dict, want: dict) -> tuple[float, str]:
    assert set(got) == set(want), set(got) ^ set(want)
    errors = {k: ((got[k] - r).norm() / r.norm()).item() for k, r in want.items()}
    worst = max(errors, key=errors.get)
    return errors[worst], worst


def _close(got: list[float], want: list[float], what: str) -> None:
    assert len(got) == len(want) == STEPS, (got, want)
    for step, (ref, value) in enumerate(zip(want, got), 1):
        assert abs(value - ref) <= RTOL * abs(ref), f"step {step}: {what} {value} vs {ref}"


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in LAYOUTS if n not in {"one", *REFERENCES.values()}])
def test_layout_matches_single_process(world, name):
    reference = REFERENCES.get(name, "one")
    baseline, result = world(1).result(reference), world(LAYOUTS[name][0]).result(name)
    _close(result["losses"], baseline["losses"], "loss")
    _close(result["grad_norms"], baseline["grad_norms"], "grad norm")
    # Step 1 starts from the same weights on the same batch: every parameter's gradient, as
    # the trainer's step left it for the optimizer, equals one process's.
    # Every replica of a replicated parameter (DDP, HSDP's replicas, TP-replicated norms) and of
    # its gradient is the same on every rank that holds one: no rank trains a model of its own.
    assert not result["grads_differ"] and not result["weights_differ"], (
        result["grads_differ"],
        result["weights_differ"],
    )
    grad_error, grad_param = _worst(result["grads"], baseline["grads"])
    update_error, update_param = _worst(result["updates"], baseline["updates"])
    weight_error, weight_param = _worst(result["weights"], baseline["weights"])
    print(
        f"\n{name}: worst step-1 gradient error {grad_error:.2e} ({grad_param}), worst step-1 "
        f"update error {update_error:.2e} ({update_param}), worst final-weight error "
        f"{weight_error:.2e} ({weight_param}) (relative, in norm)"
    )
    assert grad_error <= RTOL, f"{grad_param}: step-1 gradient off by {grad_error:.2e}"
    # The optimizer's own part: what step 1 did to each parameter (for Muon, the orthogonalized
    # whole matrix, of which each rank applied its shard).
    assert update_error <= RTOL, f"{update_param}: step-1 update off by {update_error:.2e}"
    for key, ref in baseline["weights"].items():
        torch.testing.assert_close(result["weights"][key], ref, rtol=RTOL, atol=RTOL, msg=key)
    # The run must have learned something, or equal losses would prove little.
    assert baseline["losses"][-1] < baseline["losses"][0] - 0.5
    _check_layout_facts(name, result, baseline)
    compiled_whole = "--training.compile" in LAYOUTS[name][1] and EP not in LAYOUTS[name][1]
    if baseline.get("routing") is not None and not compiled_whole:
        _check_routing(result["routing"], baseline["routing"], result["cp_positions"])


def _eval_samples(jobs: TrainerJobs, name: str) -> list[dict]:
    path = jobs.folder / name / "eval_samples" / f"step-{STEPS}" / "titanlite_mc.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", [n for n in EVAL_LAYOUTS if n not in {"one", *REFERENCES.values()}]
)
def test_eval_scores_match_single_process(world, name):
    """The same requests (the same order, all of them once), each log-likelihood within 1e-5
    of one process's, and so the same accuracies in metrics.jsonl."""
    reference = REFERENCES.get(name, "one")
    one, mine = world(1), world(LAYOUTS[name][0])
    want, got = _eval_samples(one, reference), _eval_samples(mine, name)
    assert [(s["example"], s["choice"]) for s in got] == [(s["example"], s["choice"]) for s in want]
    assert len(want) == 40
    worst = max(
        abs(g["loglikelihood"] - w["loglikelihood"]) / abs(w["loglikelihood"])
        for g, w in zip(got, want)
    )
    print(f"\n{name}: eval log-likelihoods within {worst:.2e} (relative) of one process")
    assert worst <= 1e-5, worst
    scores = [_last_eval(jobs, n) for jobs, n in ((one, reference), (mine, name))]
    assert scores[0] == scores[1] and len(scores[0]) == 4, scores


def _last_eval(jobs: TrainerJobs, name: str) -> dict:
    lines = (jobs.folder / name / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    return {k: v for k, v in last.items() if k.startswith("eval/")}


def _check_routing(ranks: list, reference: list, cp_positions: dict) -> None:
    """Step 1 routed every token of every rank to the experts one process chose for it: each
    rank's windows are matched with one process's by their token ids; under context parallel a
    rank routed its chunks' positions (cp_positions), under tensor parallel its piece of those
    (tp rank r: the r-th). Every layer's every token is compared on some rank."""
    [whole] = reference
    rows = {tuple(ids.tolist()): i for i, ids in enumerate(whole["inputs"])}
    batch, seq = whole["inputs"].shape
    compared = dict.fromkeys(whole["chosen"], 0)
    for rank in ranks:
        positions = cp_positions.get(rank["cp"], list(range(seq)))
        for layer, chosen in rank["chosen"].items():
            want = whole["chosen"][layer].view(batch, seq, -1)[:, positions].sort(-1).values
            mine = chosen.view(len(rank["inputs"]), -1, chosen.shape[-1]).sort(-1).values
            piece, tp = mine.shape[1], rank["tp"]
            for ids, got in zip(rank["inputs"], mine):
                row = want[rows[tuple(ids.tolist())]]
                assert torch.equal(got, row[tp * piece : (tp + 1) * piece]), layer
                compared[layer] += got.shape[0]
    assert all(n >= batch * seq for n in compared.values()), compared


def _check_layout_facts(name: str, result: dict, baseline: dict) -> None:
    """The layout did what it was configured to do, which parity cannot see (an uncompiled
    block, or a contiguous cut, trains the same model): every block compiled when compile is on
    (a compiled loss alone adds graphs too), each cp rank held its head-tail chunks, the experts
    were split over the expert-parallel ranks, and every process group has the training
    timeout."""
    overrides = LAYOUTS[name][1]
    blocks = {".".join(k.split(".")[:2]) for k in baseline["weights"] if k.startswith("layers.")}
    if "--training.compile" in overrides:
        assert blocks <= set(result["compiled"]), result["compiled"]
    else:
        assert not result["compiled"], result["compiled"]
    cp = int(overrides[overrides.index(CP) + 1]) if CP in overrides else 1
    assert sorted(result["cp_positions"]) == list(range(cp if cp > 1 else 0))
    if cp > 1:  # seq 64 in 2·cp chunks; rank r holds chunks r and 2·cp-1-r
        chunk = 64 // (2 * cp)
        for r, held in result["cp_positions"].items():
            tail = 2 * cp - 1 - r
            want = [*range(r * chunk, (r + 1) * chunk), *range(tail * chunk, (tail + 1) * chunk)]
            assert held == want, (r, held)
        if cp == 2:  # the same, written out
            assert result["cp_positions"][0] == [*range(16), *range(48, 64)]
            assert result["cp_positions"][1] == list(range(16, 48))
    # Expert parallel split every expert weight over its degree, and nothing else.
    ep = int(overrides[overrides.index(EP) + 1]) if EP in overrides else 1
    experts = {k for k in baseline["weights"] if ".experts." in k} if ep > 1 else set()
    assert result["expert_split"] == dict.fromkeys(experts, ep), result["expert_split"]
    # After step 1 every group the layout made (the default one, each mesh dimension's, the
    # loss's) has the training timeout (the default 100 s), on every rank.
    wrong = [(ranks, t) for ranks, t in result["group_timeouts"] if t != 100.0]
    assert result["group_timeouts"] and not wrong, wrong


# bfloat16 keeps 8 significant bits, a relative step of 2**-8 = 3.9e-3. FSDP casts the
# parameters, and so each whole block, to bf16 (MixedPrecisionPolicy); one process under autocast
# casts only the matmul inputs and keeps the residual stream in fp32. Each gradient is therefore
# rounded at other places and in another order: measured (`pytest -s -k bf16`), the step-1
# gradients differ by a worst 1.14e-2 (median 8.4e-3: about two bf16 steps), losses by 2.3e-4,
# gradient norms by 3.4e-3 and the weights after 5 steps by 2.5e-2, the same size as autocast
# itself from fp32 (7.0e-3 / 1.3e-3 / 1.9e-2). The bounds are about twice the measured worst.
# They cannot see a 0.1% error; the fp32 suites, which run the same code but the cast, do.
BF16_BOUNDS = {"loss": 1e-3, "grad_norm": 1e-2, "grads": 2.5e-2, "weights": 5e-2}
# Below this distance from the fp32 run, the layout did not compute in bf16 at all.
BF16_AT_LEAST = 1e-3


def _bf16_errors(got: dict, want: dict) -> dict[str, tuple[float, str]]:
    """The worst relative error of each figure and where it was (a step or a parameter)."""
    out = {}
    for key, series in (("loss", "losses"), ("grad_norm", "grad_norms")):
        pairs = enumerate(zip(got[series], want[series]), 1)
        errors = {f"step {i}": abs(x - y) / abs(y) for i, (x, y) in pairs}
        worst = max(errors, key=errors.get)
        out[key] = (errors[worst], worst)
    out["grads"] = _worst(got["grads"], want["grads"])
    out["weights"] = _worst(got["weights"], want["weights"])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in BF16_LAYOUTS if n != "one_bf16"])
def test_bf16_layout_matches_single_process(world, name):
    fp32, baseline = world(1).result("one"), world(1).result("one_bf16")
    result = world(BF16_LAYOUTS[name][0]).result(name)
    assert not result["grads_differ"] and not result["weights_differ"]
    errors = _bf16_errors(result, baseline)
    print(f"\n{name}: " + ", ".join(f"{k} {e:.2e} ({where})" for k, (e, where) in errors.items()))
    for key, (error, where) in errors.items():
        assert error <= BF16_BOUNDS[key], f"{name}: {key} off by {error:.2e} at {where}"
    # Both did compute in bf16: neither equals the fp32 run (a dropped cast would pass above).
    for run in (result, baseline):
        assert _worst(run["grads"], fp32["grads"])[0] > BF16_AT_LEAST


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SYNC_LAYOUTS))
def test_a_step_that_does_not_log_never_waits_for_the_device_or_the_world(world, name):
    """No device value read by the host and no blocking world-wide collective between logs
    (issue 27: the loss scale stays on the device, non-finite steps are skipped on the device,
    the stop agreement runs in the background). The steps that log must show the reads the
    probe exists to see, or it would prove nothing."""
    result = world(SYNC_LAYOUTS[name][0]).result(name)
    syncs, logged = result["host_syncs"], result["logged_steps"]
    quiet = [step for step in range(1, STEPS + 1) if step not in logged]
    print(f"\n{name}: host syncs by step {dict(sorted(syncs.items()))}")
    assert quiet == [2, 4], logged
    designed, count = DESIGNED_WAITS.get(name, ("", 0))
    for step in quiet:
        assert syncs.get(step, []).count(designed) == count, (step, syncs.get(step))
        waits = [e for e in syncs.get(step, []) if e not in NOT_WAITING and e != designed]
        assert waits == [], f"step {step} waits: {waits}"
    assert any(e.startswith("aten._local_scalar_dense.default") for e in syncs[3]), syncs[3]
