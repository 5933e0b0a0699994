"""A standing check that the tests bite: small deliberate bugs (mutants), each applied to a copy
of this checkout, and only the tests that claim to guard against it run there. A mutant that
every one of its tests passes has survived: the bug it plants would land unseen.

    python scripts/mutants.py                 # every mutant; exit 1 if one survives
    python scripts/mutants.py --list          # what each mutant plants and what guards it
    python scripts/mutants.py --only ddp_grad_scale tp_grad_scale

The checkout is never touched: each mutant gets a fresh copy of the committed tree (HEAD; with
--working-tree, the tracked and unignored files as they are now) under a temporary folder, and
the tests run there, with the copy first on the import path. One mutant at a time; the whole
set took 11.2 minutes on 2 busy CPU cores, so it runs before each release rather than in CI
(README).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from titanlite.core.arguments import ArgumentParser, int_arg  # noqa: E402

LAYOUT = "tests/distributed/test_layout_parity.py::test_layout_matches_single_process"
DEEPSEEK_HF = (
    "tests/unit/models/deepseek_v3/test_deepseek_v3_hf.py::"
    "test_a_transformers_folder_imports_with_its_logits[q_latent]"
)
BF16 = "tests/distributed/test_layout_parity.py::test_bf16_layout_matches_single_process"
EVAL_HARNESS = "tests/e2e/test_eval_harness.py::test_in_loop_scores_equal_lm_eval_on_the_export"
SYNCS = (
    "tests/distributed/test_layout_parity.py::"
    "test_a_step_that_does_not_log_never_waits_for_the_device_or_the_world[fsdp2_syncs]"
)
# A 0.1% error on the gradient of a module's first parameter. The hook goes on at the module's
# first forward: parameters hooked while still on the meta device are replaced by to_empty.
SCALE = (
    "register_forward_pre_hook(lambda m, _: None if hasattr(p := next(m.parameters()), "
    '"planted") else setattr(p, "planted", p.register_hook(lambda g: g * 1.001)))'
)


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str  # what it plants, in words
    path: str  # the file it edits, relative to the checkout
    old: str  # text that occurs exactly once in that file
    new: str  # what replaces it
    tests: tuple[str, ...]  # pytest node ids that must fail

    def apply(self, root: Path) -> None:
        file = root / self.path
        text = file.read_text()
        if text.count(self.old) != 1:
            raise ValueError(
                f"{self.name}: {self.path} holds the text to replace {text.count(self.old)} "
                "times, not once: update the mutant to the code"
            )
        file.write_text(text.replace(self.old, self.new))


def _layout(*names: str) -> tuple[str, ...]:
    return tuple(f"{LAYOUT}[{n}]" for n in names)


MUTANTS = [
    # The trainer's own step, per parameter (issue 32, item 1).
    Mutant(
        "sync_once_grad_scale",
        "0.1% on one parameter's gradient in the FSDP sync-once accumulation path",
        "titanlite/trainer/train_step.py",
        "        loss_sum = self.share_loss(loss_sum)\n",
        "        loss_sum = self.share_loss(loss_sum)\n"
        "        if self.sync_last_microbatch_only:\n"
        "            self.params[0].grad.mul_(1.001)\n",
        _layout("fsdp2_accum2_sync_once"),
    ),
    # Replicas that train models of their own (item 2).
    Mutant(
        "replica_diverges",
        "rank 1 alone scales one parameter's gradient by 1.001 after the reduction",
        "titanlite/trainer/train_step.py",
        "        loss_sum = self.share_loss(loss_sum)\n",
        "        loss_sum = self.share_loss(loss_sum)\n"
        "        if dist.get_rank() == 1:\n"
        "            self.params[0].grad.mul_(1.001)\n",
        _layout("ddp2"),
    ),
    # A compiled layout whose first block runs eagerly (item 3).
    Mutant(
        "first_block_not_compiled",
        "compile skips the first transformer block",
        "parallelisms/compile.py",
        "    for block in blocks:\n        block.compile(fullgraph=not breaks_at_dispatch)",
        "    for block in blocks[1:]:\n        block.compile(fullgraph=not breaks_at_dispatch)",
        _layout("tp2_compile"),
    ),
    # The context-parallel load balancer (item 4).
    Mutant(
        "cp_contiguous_under_headtail",
        "a contiguous cut when head-tail is configured",
        "parallelisms/context_parallel.py",
        "rank_positions(seq, self.cp, r, self.load_balancer)",
        'rank_positions(seq, self.cp, r, "none")',
        _layout("cp2"),
    ),
    # Timeouts on every group (item 5).
    Mutant(
        "timeout_default_group_only",
        "the training timeout set on the default group only",
        "titanlite/core/distributed.py",
        "    for group in list(dist.distributed_c10d._world.pg_map):",
        "    for group in [dist.distributed_c10d._get_default_group()]:",
        _layout("hsdp2x2"),
    ),
    # The restricted unpickler on the trainer's read path (item 6).
    Mutant(
        "trainer_reads_metadata_with_pickle",
        "the trainer's resume reads .metadata through torch's FileSystemReader",
        "titanlite/components/checkpoint/manager.py",
        "        reader = SafeFileSystemReader(str(path))\n",
        "        from torch.distributed.checkpoint import FileSystemReader\n\n"
        "        reader = FileSystemReader(str(path))\n",
        ("tests/e2e/test_failures.py::test_every_reader_refuses_a_crafted_metadata_on_its_own",),
    ),
    # Non-finite values on one rank (item 7): the host's verdict. A rank that does not act on it
    # only fails once its peer has stopped, so each rank's own exit code and line are checked.
    Mutant(
        "nonfinite_guard_rank0_only",
        "only rank 0 acts on a non-finite gradient norm",
        "titanlite/components/nonfinite.py",
        "        if math.isfinite(norm):\n",
        "        import torch.distributed as dist\n\n"
        "        if math.isfinite(norm) or dist.get_rank() != 0:\n",
        (
            "tests/e2e/test_nonfinite.py::"
            "test_nan_on_one_rank_stops_every_rank_at_that_step_without_its_update",
        ),
    ),
    # The skip itself, on the device: a rank that applies the bad update (issue 46, item 8).
    Mutant(
        "nonfinite_skip_rank0_only",
        "only rank 0's optimizer skips a non-finite step's update",
        "titanlite/components/nonfinite.py",
        "        scaled.found_inf = (~torch.isfinite(norm.detach())).to(torch.float32)\n",
        "        import torch.distributed as dist\n\n"
        "        scaled.found_inf = (~torch.isfinite(norm.detach())).to(torch.float32) * (\n"
        "            dist.get_rank() == 0\n"
        "        )\n",
        (
            "tests/e2e/test_nonfinite.py::"
            "test_nan_on_one_rank_stops_every_rank_at_that_step_without_its_update",
        ),
    ),
    # bf16 mixed precision (item 8).
    Mutant(
        "bf16_cast_dropped",
        "FSDP's mixed-precision policy computes in float32",
        "parallelisms/fsdp.py",
        '{"mesh": mesh, "mp_policy": MixedPrecisionPolicy(param_dtype, reduce_dtype)}',
        '{"mesh": mesh, "mp_policy": MixedPrecisionPolicy(torch.float32, reduce_dtype)}',
        (f"{BF16}[fsdp2_bf16]",),
    ),
    # Pipeline checkpoints under multi-stage schedules (item 9).
    Mutant(
        "optimizer_state_not_restored",
        "a resume loads everything but the optimizer state",
        "titanlite/components/checkpoint/manager.py",
        "                {k: self.states[k] for k in keys},",
        '                {k: self.states[k] for k in keys if k != "optimizer"},',
        (
            "tests/distributed/test_pipeline_checkpoint.py::"
            "test_multi_stage_schedules_resume_exactly_and_continue_on_one_process",
        ),
    ),
    # A preset section lost on the way to the job (item 10).
    Mutant(
        "preset_section_dropped",
        "the TOML loader drops the [lr_scheduler] section",
        "titanlite/config/loader.py",
        "    for section, body in _flatten_tables(data).items():\n",
        "    for section, body in _flatten_tables(data).items():\n"
        '        if section == "lr_scheduler":\n'
        "            continue\n",
        ("tests/unit/config/test_loader.py::test_every_preset_loads",),
    ),
    # A 0.1% gradient scale under each parallelism, in that parallelism's own code.
    Mutant(
        "fsdp_grad_scale",
        "FSDP divides one block's gradients by 1.001 x its world",
        "parallelisms/fsdp.py",
        "        fully_shard(block, reshard_after_forward=reshard, **common)\n",
        "        fully_shard(block, reshard_after_forward=reshard, **common)\n"
        "        if i == 0:\n"
        "            block.set_gradient_divide_factor(mesh.size() * 1.001)\n",
        _layout("fsdp2", "hsdp2x2"),
    ),
    Mutant(
        "ddp_grad_scale",
        "0.1% on one parameter's gradient under DDP",
        "parallelisms/ddp.py",
        "    replicate(model, device_mesh=mesh, bucket_cap_mb=100)",
        f"    replicate(model, device_mesh=mesh, bucket_cap_mb=100)\n    model.{SCALE}",
        _layout("ddp2"),
    ),
    Mutant(
        "tp_grad_scale",
        "0.1% on one parameter's gradient under tensor parallel",
        "parallelisms/llama/tensor_parallel.py",
        '    """Apply the plan to a Llama-structured model (tok_embeddings, layers, norm, output)."""\n',
        '    """Apply the plan to a Llama-structured model (tok_embeddings, layers, norm, output)."""\n'
        f"    blocks[0].{SCALE}\n",
        _layout("tp2"),
    ),
    Mutant(
        "cp_grad_scale",
        "0.1% on one parameter's gradient under context parallel",
        "parallelisms/context_parallel.py",
        "def apply_cp(model: nn.Module, blocks: list[nn.Module], shards: SequenceShards) -> None:\n",
        "def apply_cp(model: nn.Module, blocks: list[nn.Module], shards: SequenceShards) -> None:\n"
        f"    blocks[0].{SCALE}\n",
        _layout("cp2"),
    ),
    Mutant(
        "pp_grad_scale",
        "0.1% on one parameter's gradient under pipeline parallel",
        "parallelisms/pipeline.py",
        "        parts.append(part)\n",
        f"        part.{SCALE}\n        parts.append(part)\n",
        _layout("pp2_1f1b"),
    ),
    # No host sync in a step that does not log (issue 27, item 6).
    Mutant(
        "loss_scale_read_on_host",
        "the loss scale's token count read by the host, as before",
        "titanlite/trainer/train_step.py",
        "self.global_sum(counted).clamp_min(1)",
        "torch.tensor(self.global_sum(counted).clamp_min(1).tolist())",
        (SYNCS,),
    ),
    Mutant(
        "nonfinite_norm_read_each_step",
        "the non-finite guard reads the norm every step, as for non-fused optimizers",
        "titanlite/components/nonfinite.py",
        "        if not supports_found_inf(optimizer):\n",
        "        if True:\n",
        (SYNCS,),
    ),
    Mutant(
        "stop_agreement_blocking",
        "the stop agreement waits for its all-reduce in the step, as before",
        "titanlite/components/preemption.py",
        "        decided = self._collect()\n",
        "        dist.all_reduce(torch.tensor([self.signum]), op=dist.ReduceOp.MAX)\n"
        "        decided = self._collect()\n",
        (SYNCS,),
    ),
    # Memory figures that must match the GPU (issue 27, items 11 and 12).
    Mutant(
        "kept_unsharded_grads_not_counted",
        "the dry run leaves out FSDP's unsharded gradients kept between micro-batches",
        "titanlite/planning/dry_run.py",
        "    if keeps_unsharded_grads(job, pre.dims, pre.grad_accum_steps):\n",
        "    if False:\n",
        (
            "tests/distributed/test_kept_grads.py::"
            "test_every_unsharded_gradient_counts_in_the_reduce_dtype",
        ),
    ),
    Mutant(
        "headroom_without_nccl",
        "the dry run's headroom leaves out the NCCL communicators",
        "titanlite/planning/headroom.py",
        "        return self.cuda_context + self.communicators * NCCL_COMMUNICATOR\n",
        "        return self.cuda_context\n",
        (
            "tests/distributed/test_dry_run.py::"
            "test_headroom_is_the_cuda_context_and_each_nccl_communicator",
        ),
    ),
    Mutant(
        "reserved_memory_not_logged",
        "memory_reserved_gib missing from the metrics on CUDA",
        "titanlite/components/metrics/logger.py",
        '            "memory_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30,\n',
        "",
        (
            "tests/unit/components/metrics/test_memory_metrics.py::"
            "test_cuda_peaks_reach_jsonl_tensorboard_and_the_console",
        ),
    ),
    Mutant(
        "expandable_segments_not_exported",
        "run_train.sh leaves the CUDA allocator's settings at torch's defaults",
        "run_train.sh",
        "    export PYTORCH_ALLOC_CONF=expandable_segments:True\n",
        "    :\n",
        (
            "tests/e2e/test_allocator_env.py::"
            "test_run_train_sh_turns_on_expandable_segments_unless_the_user_chose",
        ),
    ),
    Mutant(
        "moe_tp_grads_not_summed",
        "the MoE's replicated experts keep each tp rank's own gradient",
        "parallelisms/moe_tp.py",
        "lambda param: SumGradOverGroup.apply(param.to_local(), group)",
        "lambda param: param.to_local()",
        _layout("qwen3_moe_tp2"),
    ),
    Mutant(
        "moe_counts_not_summed_over_tp",
        "each tp rank moves the expert bias from its own tokens' counts",
        "titanlite/trainer/trainer.py",
        "            expert_load_sum=self.expert_load_sum,\n",
        "",
        _layout("qwen3_moe_bias_tp2"),
    ),
    Mutant(
        "moe_aux_not_completed_over_cp",
        "a cp rank's aux loss is that of its own chunks",
        "parallelisms/context_parallel.py",
        "            complete_sequences_over(feed_forward, shards.group, grads_summed=False)\n",
        "            pass\n",
        _layout("qwen3_moe_cp2"),
    ),
    # Bad input, round three (issue 46, item 1).
    Mutant(
        "partial_model_load_by_default",
        "a checkpoint with more blocks than configured loads into the smaller model unasked",
        "titanlite/preflight/checkpoint.py",
        "    if not (missing or reshaped) and job.checkpoint.allow_partial_model_load:\n",
        "    if not (missing or reshaped):\n",
        (
            "tests/e2e/test_failures.py::test_checkpoint_problems_stop_in_preflight_with_one_line",
            "tests/unit/preflight/test_checkpoint_model.py::"
            "test_a_partial_load_is_admitted_only_for_a_subset_and_only_on_request",
        ),
    ),
    # (issue 46, item 2)
    Mutant(
        "hf_integer_weights_cast",
        "an integer tensor of a Hugging Face folder is cast to float, not refused",
        "titanlite/components/checkpoint/hf.py",
        "        if e.dtype not in _WEIGHT_DTYPES:\n",
        "        if e.dtype not in _WEIGHT_DTYPES and False:\n",
        (
            "tests/e2e/test_hf_dtypes.py::"
            "test_int32_weights_stop_the_converter_and_the_run_in_one_line",
            "tests/unit/models/qwen3/test_qwen3_hf.py::"
            "test_a_moe_folder_with_an_integer_expert_is_refused_in_one_line",
        ),
    ),
    # DeepSeek-V3 (issue 47): what a reimplementation of MLA, DeepSeekMoE and MTP gets wrong.
    Mutant(
        "mla_rope_on_the_nope_part",
        "RoPE rotates the first qk_rope_head_dim entries of each query head, not its last",
        "models/deepseek_v3/attention.py",
        "q_nope, q_rope = q.split([self.nope, self.rope], dim=-1)",
        "q_rope, q_nope = q.split([self.rope, self.nope], dim=-1)",
        (DEEPSEEK_HF,),
    ),
    Mutant(
        "mla_softmax_scale_of_the_nope_width",
        "the softmax scale is 1/sqrt(qk_nope_head_dim), not 1/sqrt(qk_nope + qk_rope)",
        "models/deepseek_v3/args.py",
        "scale = self.qk_head_dim**-0.5",
        "scale = self.qk_nope_head_dim**-0.5",
        (DEEPSEEK_HF,),
    ),
    Mutant(
        "group_routing_over_strided_groups",
        "expert groups are every n_group-th expert instead of consecutive experts",
        "models/moe.py",
        "grouped = steered.view(-1, a.n_group, a.num_experts // a.n_group)",
        "grouped = steered.view(-1, a.num_experts // a.n_group, a.n_group).transpose(1, 2)",
        (DEEPSEEK_HF,),
    ),
    Mutant(
        "shared_experts_dropped",
        "the MoE's shared experts are left out of its output",
        "models/moe.py",
        "            out = out + self.shared_experts(flat)\n",
        "            pass\n",
        (DEEPSEEK_HF,),
    ),
    Mutant(
        "mtp_shift_off_by_one",
        "MTP depth k embeds the token k - 1 ahead (the input itself at depth 1), not k ahead",
        "models/deepseek_v3/model.py",
        "ahead = shift_left(ids, k, 0)",
        "ahead = shift_left(ids, k - 1, 0)",
        (
            "tests/unit/models/deepseek_v3/test_deepseek_v3_hf.py::"
            "test_the_mtp_module_equals_transformers_and_its_loss_is_the_shifted_cross_entropy",
        ),
    ),
    Mutant(
        "mtp_cp_token_ahead_from_the_ranks_chunks",
        "under context parallel MTP embeds the token k ahead within the rank's own chunks",
        "models/deepseek_v3/model.py",
        "ahead = ahead.index_select(1, query_positions)",
        "ahead = shift_left(ids.index_select(1, query_positions), k, 0)",
        _layout("deepseek_cp2"),
    ),
    Mutant(
        "mtp_cp_targets_shifted_after_the_cut",
        "under context parallel each MTP depth's targets are shifted within the rank's chunks",
        "titanlite/trainer/train_step.py",
        "return [t if shards is None else shards.shard(t) for t in self.mtp_targets(labels)]",
        "return self.mtp_targets(labels if shards is None else shards.shard(labels))",
        _layout("deepseek_cp2"),
    ),
    Mutant(
        "mtp_loss_over_the_main_count",
        "each MTP depth's loss is divided by the main targets' count, not by its own",
        "titanlite/trainer/train_step.py",
        "mtp = torch.stack([s * c for s, c in zip(sums, scales[1:])]).mean()",
        "mtp = torch.stack([s * scales[0] for s in sums]).mean()",
        (
            "tests/unit/trainer/test_mtp_step.py::test_the_step_weighs_each_depth_over_its_own_targets",
        ),
    ),
    Mutant(
        "mla_rope_key_grad_not_summed_over_tp",
        "each tp rank keeps its own heads' share of the shared RoPE key's gradient",
        "parallelisms/deepseek_v3/tensor_parallel.py",
        "(SumGradOverGroup.apply(args[0], group), *args[1:])",
        "(args[0], *args[1:])",
        _layout("deepseek_tp2"),
    ),
    Mutant(
        "muon_orthogonalizes_the_local_shard",
        "each rank orthogonalizes its shard of a matrix instead of the whole matrix",
        "titanlite/components/muon.py",
        "    if not isinstance(param, DTensor):\n        return update, lambda t: t",
        "    if True:\n        return update, lambda t: t",
        _layout("muon_fsdp2", "muon_tp2"),
    ),
    Mutant(
        "muon_lr_not_adjusted",
        "the per-matrix LR adjustment (adjust_lr_fn) is skipped",
        "titanlite/components/muon.py",
        'alpha=-adjusted_lr(lr, group["adjust_lr_fn"], rows, cols)',
        "alpha=-lr",
        (
            "tests/unit/components/test_muon.py::test_muon_equals_torch_muon_and_adamw_step_for_step[llama]",
        ),
    ),
    Mutant(
        "muon_on_the_embedding",
        "the embedding is stepped by Muon, not AdamW",
        "titanlite/components/param_groups.py",
        "if p.dim() < 2 or isinstance(owner, nn.Embedding):",
        "if p.dim() < 2:",
        (
            "tests/unit/components/test_muon.py::test_muon_equals_torch_muon_and_adamw_step_for_step[llama]",
        ),
    ),
    Mutant(
        "eval_continuation_first_token_dropped",
        "the in-loop eval scores a continuation without its first token",
        "titanlite/trainer/evaluate.py",
        "labels[row, n - r.continuation : n] = tokens[-r.continuation :]",
        "labels[row, n - r.continuation + 1 : n] = tokens[-r.continuation + 1 :]",
        (EVAL_HARNESS,),
    ),
    Mutant(
        "eval_acc_norm_by_words",
        "acc_norm divides the log-likelihood by the choice's words, not its characters",
        "titanlite/evals/metrics.py",
        "normed = [ll / float(len(c)) for ll, c in zip(lls, ex.choices)]",
        "normed = [ll / float(len(c.split())) for ll, c in zip(lls, ex.choices)]",
        ("tests/unit/evals/test_tasks.py::test_scores_as_lm_eval_computes_them",),
    ),
    Mutant(
        "eval_examples_on_every_rank",
        "every data-parallel rank scores every request, so the sum counts each twice",
        "titanlite/trainer/evaluate.py",
        "mine = list(range(self.dp_rank, len(self.requests), self.dp_size))",
        "mine = list(range(len(self.requests)))",
        ("tests/distributed/test_layout_parity.py::test_eval_scores_match_single_process[fsdp2]",),
    ),
]


def copy_checkout(dest: Path, working_tree: bool) -> None:
    """HEAD's tree, or with `working_tree` the tracked and unignored files as they are now."""
    if not working_tree:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def run_mutant(mutant: Mutant, timeout: int, working_tree: bool) -> tuple[str, float, str]:
    """('killed' | 'survived' | 'error' | 'timeout', seconds, the tests' last lines)."""
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as tmp:
        copy = Path(tmp)
        copy_checkout(copy, working_tree)
        mutant.apply(copy)
        env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = [sys.executable, "-m", "pytest", "-n", "0", "-x", "-q", "-p", "no:cacheprovider"]
        start = time.monotonic()
        # Its own session, so that a timeout or Ctrl-C ends the tests' ranks and fork server too.
        proc = subprocess.Popen(
            [*cmd, *mutant.tests],
            cwd=copy,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return "timeout", time.monotonic() - start, ""
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        seconds = time.monotonic() - start
        tail = "\n".join(output.strip().splitlines()[-3:])
        # pytest: 0 all passed, 1 some failed; anything else (no tests collected, a usage or
        # collection error) says nothing about the mutant.
        outcome = {0: "survived", 1: "killed"}.get(proc.returncode, "error")
        return outcome, seconds, tail


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    parser.add_argument(
        "--timeout", type=int_arg(1, 30 * 24 * 3600), default=900, help="seconds per mutant"
    )
    parser.add_argument(
        "--working-tree", action="store_true", help="mutate uncommitted changes too, not HEAD"
    )
    args = parser.parse_args(argv)
    by_name = {m.name: m for m in MUTANTS}
    unknown = sorted(set(args.only or ()) - set(by_name))
    if unknown:
        parser.error(f"unknown mutant(s) {', '.join(unknown)}; --list names them")
    chosen = [by_name[n] for n in args.only] if args.only else MUTANTS
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.bug} ({m.path})\n    guarded by {', '.join(m.tests)}")
        return 0
    start, failed = time.monotonic(), []
    for m in chosen:
        outcome, seconds, tail = run_mutant(m, args.timeout, args.working_tree)
        print(f"{m.name:36s} {outcome:8s} {seconds:6.1f} s", flush=True)
        if outcome != "killed":
            failed.append(m.name)
            print("    " + tail.replace("\n", "\n    "), flush=True)
    total = time.monotonic() - start
    print(f"{len(chosen) - len(failed)} of {len(chosen)} mutants killed in {total / 60:.1f} min")
    if failed:
        print(f"not killed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
