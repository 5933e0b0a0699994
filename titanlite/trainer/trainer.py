"""The trainer: where the config sections meet, and the loop (started by `python -m
titanlite.train --config PATH [...]`, through titanlite.cli).

Flow: config + preflight checks (no process group yet) -> process group and mesh -> tokenizer
and loader -> titanlite.build.assemble (model on meta -> parallelize -> materialize -> optimizer) ->
checkpoint load -> the loop. The step itself is a TrainStep (titanlite.trainer.train_step); what
happens around it (Hugging Face load and export, saves, profiler, memory snapshots, gc, the
preemption agreement, metrics) is an ordered list of callbacks (titanlite.trainer.callbacks);
where the time goes is the metrics' Clock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from models.attention import choose_kernel
from models.moe import set_aux_loss_weight
from titanlite.build import assemble as build
from titanlite.build.options import pipeline_options
from titanlite.components.checkpoint.manager import CheckpointManager
from titanlite.components.checkpoint.record import config_hash, model_config_record
from titanlite.components.clock import Clock
from titanlite.components.loss import ignore_boundary_targets
from titanlite.components.metrics.file import FILE as METRICS_FILE
from titanlite.components.metrics.file import read_metrics
from titanlite.components.metrics.logger import MetricsLogger, tb_run_dir
from titanlite.components.nonfinite import NonFiniteGuard
from titanlite.components.optim import build_lr_scheduler, reconcile_resumed_settings
from titanlite.components.preemption import StopRequest
from titanlite.config import loader as config_lib
from titanlite.config.schema import JobConfig
from titanlite.core import distributed
from titanlite.core.logging import logger
from titanlite.data import DatasetError, Mixture, ShardSet, Tokenizer, build_dataloader
from titanlite.data.mixture import describe as describe_mixture
from titanlite.data.split_tokenize import exchange_group
from titanlite.preflight import checks as preflight
from titanlite.preflight.data import validation_paths
from titanlite.trainer import callbacks as cb
from titanlite.trainer.callbacks.metrics import moe_figures
from titanlite.trainer.evaluate import Evaluator
from titanlite.trainer.pipeline_step import PipelineStep
from titanlite.trainer.train_step import Microbatch, PipelineTrainStep, TrainStep
from titanlite.trainer.validate import ValidationData, Validator


class TrainState:
    """What the loop itself must carry across a resume."""

    def __init__(self) -> None:
        self.step, self.tokens_seen, self.elapsed_s = 0, 0, 0.0

    def state_dict(self) -> dict:
        return {"step": self.step, "tokens_seen": self.tokens_seen, "elapsed_s": self.elapsed_s}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.tokens_seen = int(state["step"]), int(state["tokens_seen"])
        self.elapsed_s = float(state["elapsed_s"])


class Trainer:
    def __init__(self, job: JobConfig, pre: preflight.Preflight, launch_start: float | None = None):
        self.job, self.pre, self.dims = job, pre, pre.dims
        self.preempted = 0  # the signal number that stopped train() early
        self.stop_message = ""
        self.launch_start = time.perf_counter() if launch_start is None else launch_start
        # A group that a launcher made (Ray Train, or a test running many jobs in one group)
        # is the launcher's to destroy.
        self.owns_process_group = not dist.is_initialized()
        traces = Path(job.job.dump_folder) / job.comm.save_traces_folder
        distributed.enable_flight_recorder(
            distributed.device_type(), job.comm.trace_buf_size, traces, os.environ
        )
        self.device = distributed.init(job.comm.init_timeout_seconds)
        self.rank = dist.get_rank()
        distributed.check_distinct_devices(self.device)
        self.meshes = self.dims.build_meshes(self.device.type)
        distributed.log_layout(self.meshes.world, self.dims.describe(), self.device)
        self.seed = distributed.agree_on_seed(job.training.seed)
        distributed.set_determinism(self.seed, job.training.deterministic)
        self.dump_folder = Path(job.job.dump_folder)
        self._build_data()
        self._build_model()
        self._build_checkpoint_and_metrics()

    def _build_data(self) -> None:
        t, pre, v = self.job.training, self.pre, self.job.validation
        self.dp_mesh = self.meshes.dp
        self.dp_rank, self.dp_size = (
            (self.dp_mesh.get_local_rank(), self.dp_mesh.size()) if self.dp_mesh else (0, 1)
        )
        dp_rank, dp_size = self.dp_rank, self.dp_size
        # Kept: the evaluator reads its padding id (one tokenizer load per launch).
        self.tokenizer = tokenizer = Tokenizer(pre.tokenizer_path)
        sources = [pre.dataset, *pre.validation_datasets.values()]
        if isinstance(pre.dataset, Mixture):
            sources += pre.dataset.shards
        for source in sources:
            if isinstance(source, ShardSet):
                self._verify_shards(source)
        assert pre.dataset is not None  # None only in a dry run
        # The ranks that read different sequences share tokenizing each text stream (the
        # dataset, or each text source of a mixture), on a gloo group of their own per
        # data-parallel group and stream: a stream's reader thread exchanges on it at any time.
        streams = (
            len(pre.dataset.text_sources)
            if isinstance(pre.dataset, Mixture)
            else int(not isinstance(pre.dataset, ShardSet))
        )
        self.tokenize_groups = [exchange_group(self.meshes.dp_groups()) for _ in range(streams)]
        per_step = t.local_batch_size * dp_size * pre.grad_accum_steps  # the global batch
        self.dataloader = build_dataloader(
            pre.dataset,
            tokenizer,
            seq_len=t.seq_len,
            local_batch_size=t.local_batch_size,
            dp_rank=dp_rank,
            dp_size=dp_size,
            seed=self.seed,
            text_field=t.dataset_text_field,
            tokenize_groups=self.tokenize_groups,
            windows_per_step=per_step,
        )
        if isinstance(pre.dataset, Mixture) and self.rank == 0:
            logger.info(describe_mixture(pre.dataset.plan(t.steps, per_step, t.seq_len)))
        self.validation_data = {
            name: ValidationData(
                pre.validation_datasets[name],
                tokenizer,
                v.seq_len or t.seq_len,
                v.local_batch_size or t.local_batch_size,
                dp_rank,
                dp_size,
                v.steps,
                t.dataset_text_field,
                key,
            )
            for name, _, key in (validation_paths(self.job) if v.enabled else [])
        }

    def _build_model(self) -> None:
        job, pre, t = self.job, self.pre, self.job.training
        built = build.build_model(job, self.dims, pre.model_args, self.meshes, self.device.type)
        spec = built.family.model
        self.flops_per_token = spec.training_flops_per_token(pre.model_args, t.seq_len)
        logger.info(
            f"model {job.model.name} {job.model.flavor}: {spec.num_params(pre.model_args):,} "
            f"parameters, {self.flops_per_token / 1e9:.3f} GFLOPs per token (training), "
            f"seed {self.seed}"
        )
        kernel = choose_kernel(
            job.model.attn_type,
            job.model.attn_mask_type,
            self.device.type,
            built.options.param_dtype,
            positions=self.dims.cp > 1,
        )
        logger.info(
            f"attention: {job.model.attn_mask_type} through {kernel!r} ({job.model.attn_type})"
        )
        if built.float8_plan is not None:
            logger.info(built.float8_plan.describe())
        if built.pipeline_summary:
            logger.info(built.pipeline_summary)
        self.model = build.materialize(built, self.device, self.seed)
        if job.model.print_after_conversion and self.rank == 0:
            logger.info(f"model after parallelization:\n{self.model}")
        self.loss_fn = build.build_loss_fn(job)
        # Under block_causal the model cannot see across a document boundary, so the target
        # there (a document's first token) gets no loss either.
        self.boundary_bos_id = (
            pre.model_args.bos_id if job.model.attn_mask_type == "block_causal" else None
        )
        param_dtype = built.options.param_dtype
        # FSDP casts parameters itself; without it, autocast gives the same compute dtype.
        amp = (
            torch.autocast(self.device.type, dtype=param_dtype)
            if not self.dims.fsdp_enabled and param_dtype != torch.float32
            else contextlib.nullcontext()
        )
        self.optimizer = build.build_optimizer(job, built)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, job.lr_scheduler, t.steps)
        self.grad_accum_steps = pre.grad_accum_steps
        # Each forward's MoE auxiliary loss weighs its share of the rank's sequences per step.
        set_aux_loss_weight(self.model, job.training.local_batch_size * self.grad_accum_steps)
        self.train_state = TrainState()
        self.nonfinite = NonFiniteGuard(t.skip_nonfinite_steps)
        self.train_step = self._build_train_step(built, amp)
        self.validator = None
        if self.validation_data:
            self.validator = Validator(
                job.validation,
                self.validation_data,
                self.model,
                self.loss_fn,
                self.device,
                built.loss_parallel,
                amp,
                self.global_sum,
                self.boundary_bos_id,
                forward_loss=self.train_step.eval_loss,
                sequence_shards=built.sequence_shards,
            )
        self.evaluator = self._build_evaluator(built, amp)

    def _build_evaluator(self, built: build.BuiltModel, amp) -> Evaluator | None:
        if not self.pre.eval_tasks:
            return None
        evaluator = Evaluator(
            self.job.eval,
            self.pre.eval_tasks,
            self.train_step.row_losses,
            built.parts,
            self.device,
            self.job.training.local_batch_size,
            self.job.training.seq_len,
            self.tokenizer.eos_id,
            self.dp_rank,
            self.dp_size,
            self.global_sum,
            built.loss_parallel,
            amp,
            built.sequence_shards,
            fixed_shape=self.dims.pp_enabled or self.dims.cp > 1 or self.job.training.compile,
            samples_folder=(
                self.dump_folder / "eval_samples"
                if self.job.eval.log_samples and self.rank == 0
                else None
            ),
        )
        logger.info(evaluator.describe())
        return evaluator

    def _build_train_step(self, built: build.BuiltModel, amp) -> TrainStep:
        job, dims = self.job, self.dims
        args = (self.model, self.optimizer, self.lr_scheduler, self.loss_fn)
        kwargs = dict(
            step=lambda: self.train_state.step,
            device=self.device,
            amp=amp,
            loss_parallel=built.loss_parallel,
            sequence_shards=built.sequence_shards,
            loss_ranks=dims.loss_ranks,
            global_sum=self.global_sum,
            expert_load_sum=self.expert_load_sum,
            max_norm=job.training.max_norm,
            nonfinite=self.nonfinite,
        )
        if not dims.pp_enabled:
            sync_each = job.parallelism.fsdp_sync_grads_each_microbatch
            last_only = dims.fsdp_enabled and not sync_each
            return TrainStep(*args, **kwargs, sync_last_microbatch_only=last_only)
        pipeline = PipelineStep(
            built,
            self.meshes.get("pp"),
            self.device,
            job.training.local_batch_size,
            self.loss_fn,
            pipeline_options(job),
        )
        return PipelineTrainStep(pipeline, *args, **kwargs)

    def _build_checkpoint_and_metrics(self) -> None:
        job, pre, t = self.job, self.pre, self.job.training
        self.checkpointer = CheckpointManager(
            job.checkpoint,
            self.dump_folder,
            model=self.model,
            optimizer=self.optimizer,
            lr_scheduler=self.lr_scheduler,
            dataloader=self.dataloader,
            train_state=self.train_state,
            total_steps=t.steps,
            model_config=model_config_record(
                job.model.name, job.model.flavor, pre.model_args, pre.tokenizer_path
            ),
        )
        if not job.checkpoint.create_seed_checkpoint and self.checkpointer.load():
            logger.info(f"resuming at step {self.train_state.step}")
        resumed = self.checkpointer.resumed_from is not None
        # What actually runs: saved, hashed into each checkpoint and shown in TensorBoard.
        self.config_text = config_lib.to_toml(self._running_config(resumed))
        self.config_hash = config_hash(self.config_text)
        if self.rank == 0:
            config_lib.save_resolved(self.dump_folder, self.config_text)
        # Steps up to here were trained by an earlier launch past its last checkpoint: this
        # launch trains them again (lost time for goodput).
        self.clock = Clock(self.launch_start, last_logged_step(self.dump_folder) if resumed else 0)
        self.tokens_per_step = (
            t.local_batch_size * t.seq_len * self.grad_accum_steps * self.dims.dp_size
        )
        self.metrics = MetricsLogger(
            job.metrics,
            self.dump_folder,
            self.device,
            write_files=self.rank == 0,
            flops_per_token=self.flops_per_token,
            # Each device does its share of every token's FLOPs: tp and pp ranks split a
            # model, data-parallel ranks split the batch.
            tokens_per_step_per_device=self.tokens_per_step / self.dims.world_size,
            total_steps=t.steps,
            start_step=self.train_state.step,
            rank=self.rank,
            config_text=self.config_text,
            tb_dir=tb_run_dir(self.dump_folder / job.metrics.save_tb_folder, resumed=resumed),
            clock=self.clock,
            pp_group=self.train_step.pp_group,
        )
        logger.info(
            f"training {t.steps} steps: {t.local_batch_size} x {t.seq_len} tokens per rank per "
            f"micro-batch, {self.grad_accum_steps} micro-batch(es) per step, data-parallel degree "
            f"{self.dims.dp_size}, {t.local_batch_size * self.dims.dp_size * self.grad_accum_steps} "
            "sequences per step"
        )

    def _running_config(self, resumed: bool) -> JobConfig:
        """The job config as it runs: after a resume, with the checkpoint's value of each
        [optimizer] setting where the two disagree (one warning each), unless the user asked to
        apply the configured ones. The job config itself is left alone."""
        job, apply = self.job, self.job.checkpoint.apply_new_optimizer_settings
        if not resumed:
            return job
        cfg = job.optimizer
        differences = reconcile_resumed_settings(self.optimizer, self.lr_scheduler, cfg, apply)
        for key, (saved, configured) in differences.items():
            if apply:
                logger.warning(
                    f"optimizer.{key} = {configured} applied over the checkpoint's {saved} "
                    "(checkpoint.apply_new_optimizer_settings)"
                )
            else:
                logger.warning(
                    f"optimizer.{key}: the checkpoint's {saved} continues, not the configured "
                    f"{configured}; pass --checkpoint.apply_new_optimizer_settings to apply it"
                )
        if apply or not differences:
            return job
        kept: dict[str, Any] = {
            key: list(saved) if isinstance(saved, tuple) else saved  # ns_coefficients
            for key, (saved, _) in differences.items()
        }
        return dataclasses.replace(job, optimizer=dataclasses.replace(cfg, **kept))

    def _verify_shards(self, shards: ShardSet) -> None:
        """Checksum every prepared shard before training, the ranks sharing the reading."""
        start = time.perf_counter()
        problems = distributed.shared_check(
            len(shards.shards), shards.verify_checksums, self.job.comm.init_timeout_seconds
        )
        if problems:
            raise DatasetError(f"{shards.key}: " + "; ".join(problems[:3]))
        logger.info(
            f"{shards.manifest_file}: {len(shards.shards)} shards, "
            f"{shards.total_tokens:,} tokens, checksums verified in "
            f"{time.perf_counter() - start:.1f}s"
        )

    def next_microbatches(self, data_iter: Iterator[Microbatch]) -> list[Microbatch]:
        with self.clock.span("data"):
            batches = []
            for x, y in (next(data_iter) for _ in range(self.grad_accum_steps)):
                if self.boundary_bos_id is not None:
                    y = ignore_boundary_targets(y, self.boundary_bos_id)
                batches.append(
                    (x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True))
                )
            return batches

    def global_sum(self, value: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks holding different tokens, data- and context-parallel (a copy; the
        value itself is left alone)."""
        value = value.clone()
        if self.meshes.dp_cp is not None:
            dist.all_reduce(value, group=self.meshes.dp_cp.get_group())
        return value

    def expert_load_sum(self, value: torch.Tensor) -> torch.Tensor:
        """global_sum, and over tensor parallel too: each tp rank routes its own sequence shard
        through the replicated experts (parallelisms/moe_tp.py)."""
        value = self.global_sum(value)
        if self.meshes.tp is not None:
            dist.all_reduce(value, group=self.meshes.tp.get_group())
        return value

    def global_mean(self, value: torch.Tensor) -> float:
        """Mean over those ranks (gloo has no AVG: sum, then divide)."""
        return (self.global_sum(value) / self.dims.loss_ranks).item()

    def validate(self, step: int) -> dict[str, float] | None:
        """The validation losses and eval scores due at `step` (their time is kept out of tps):
        val_loss, val_loss_<name> for each named held-out set, eval/<task>/<metric>."""
        results: dict[str, float] = {}
        total = self.job.training.steps
        if self.validator is not None and self.validator.due(step, total):
            with self.clock.span("validation"):
                results.update(self.validator.run())
        if self.evaluator is not None and self.evaluator.due(step, total):
            with self.clock.span("eval"):
                results.update(self.evaluator.run(step))
        return results or None

    def save_seed_checkpoint(self) -> None:
        self.checkpointer.save(0, config_hash=self.config_hash, weights_only=True)
        logger.info(f"seed checkpoint written to {self.checkpointer.folder / 'step-0'}")

    def _callbacks(
        self, stop: StopRequest
    ) -> tuple[cb.Callbacks, cb.PreemptionAgreement, cb.MetricsLogging]:
        """What runs around the steps, in this order (each hook is called down the list); the
        preemption agreement and the metrics are returned again for what train() reads."""
        job, rank, ckpt, steps = self.job, self.rank, self.checkpointer, self.job.training.steps
        callbacks = cb.Callbacks()
        saver = cb.Saver(
            ckpt,
            self.clock,
            self.config_hash,
            callbacks.post_checkpoint_saved,
            self.nonfinite.failing,
        )
        preemption = cb.PreemptionAgreement(stop, saver, job.checkpoint.enable_checkpoint, steps)
        figures: list[Callable[[], dict]] = []
        if getattr(self.pre.model_args, "moe", None) is not None:
            figures.append(
                partial(moe_figures, self.model, self.global_mean, self.metrics.pp_group)
            )
        if isinstance(self.pre.dataset, Mixture):
            figures.append(self._tokens_per_source)
        metrics = cb.MetricsLogging(
            self.metrics,
            self.global_mean,
            self.nonfinite,
            lambda: self.train_state.step,
            lambda: {k: v for figure in figures for k, v in figure().items()},
        )
        callbacks += [
            cb.HFInitialLoad(ckpt, self.model, self.pre.model_args),
            cb.CheckpointWhenDue(saver),
            cb.Profiler(job.profiling, self.dump_folder, rank),
            cb.MemorySnapshots(job.profiling, self.dump_folder, rank),
            cb.GarbageCollection(job.training.gc_freq),
            preemption,  # last of those that act after a step: it may save once more
            cb.HFExport(saver, job.checkpoint, steps),
            metrics,
        ]
        return callbacks, preemption, metrics

    def _tokens_per_source(self) -> dict:
        """Each mixture source's training tokens so far (cumulative, every rank's), and its
        achieved share of them."""
        dataset = self.dataloader.dataset
        windows = dataset.windows_per_source()
        total = max(sum(windows), 1)
        seq_len = self.job.training.seq_len
        return {
            **{f"tokens_{n}": w * seq_len for n, w in zip(dataset.names, windows)},
            "data_share": {n: w / total for n, w in zip(dataset.names, windows)},
        }

    def train(self, stop: StopRequest | None = None) -> list[dict]:
        """The loop; `self.preempted` is the signal number that stopped it early, else 0.
        Returns the metrics records it logged."""
        state, stop, steps = self.train_state, stop or StopRequest(), self.job.training.steps
        callbacks, preemption, metrics = self._callbacks(stop)
        try:
            callbacks.pre_train()
            stop.arm()
            data_iter = iter(self.dataloader)
            # Until the first step is done the start-up timeout holds on every training group
            # (torch gives mesh groups its own 30-minute gloo / 10-minute NCCL default): a
            # first step that compiles can keep ranks apart for minutes. The checkpoint's group
            # keeps its own timeout throughout.
            own = (self.checkpointer.pg,) if self.checkpointer.pg is not None else ()
            distributed.set_timeout(self.job.comm.init_timeout_seconds, skip=own)
            first_step = state.step + 1
            self.clock.start_training()
            while state.step < steps and not preemption.signum:
                state.step += 1
                self.clock.step_begin()
                microbatches = self.next_microbatches(data_iter)
                try:
                    out = self.train_step(microbatches)
                except Exception as error:
                    callbacks.on_error(state.step, error)
                    raise
                state.tokens_seen += self.tokens_per_step
                callbacks.post_train_batch(state.step, out, self.validate(state.step))
                state.elapsed_s += self.clock.step_end(state.step)
                callbacks.post_step(state.step)
                if state.step == first_step:
                    distributed.set_timeout(self.job.comm.train_timeout_seconds, skip=own)
            stop.restore()
            self.preempted, self.stop_message = preemption.signum, preemption.message
            if not self.preempted:
                self.nonfinite.check_finished()  # exit 3 for a run that skipped its training
                logger.info(
                    f"training done: {state.step} steps, {state.tokens_seen:,} tokens; outputs "
                    f"in {self.dump_folder.resolve()}"
                )
            callbacks.post_train()
        finally:
            callbacks.close()
        return metrics.records

    def close(self) -> None:
        self.checkpointer.close()
        self.metrics.close()
        close_reader = getattr(self.dataloader.dataset, "close", None)
        if close_reader is not None:
            close_reader()
        for group in self.tokenize_groups:
            if group is not None and not self.owns_process_group:
                dist.destroy_process_group(group)
        if self.owns_process_group and dist.is_initialized():
            dist.destroy_process_group()


def last_logged_step(dump_folder: Path) -> int:
    """The highest step in metrics.jsonl (0 if none): how far earlier launches got. A torn line
    (a crash mid-write) is skipped: it must not make a good checkpoint unusable."""
    path = dump_folder / METRICS_FILE
    return max(read_metrics(path), default=0) if path.exists() else 0
