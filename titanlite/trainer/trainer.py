"""The trainer: where the config sections meet, and the loop (started by `python -m
titanlite.train --config PATH [...]`, through titanlite.cli).

Flow: config + preflight checks (no process group yet) -> process group and mesh -> tokenizer
and loader -> titanlite.build.assemble (model on meta -> parallelize -> materialize -> optimizer) ->
checkpoint load -> the loop. What happens around a step (saves, profiler, memory snapshots, gc,
the preemption agreement) is an ordered list of step-end hooks; where the time goes is the
metrics' Clock.
"""

from __future__ import annotations

import contextlib
import gc
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from parallelisms import loss_context
from titanlite.build import assemble as build
from titanlite.components.checkpoint.manager import CheckpointManager
from titanlite.components.checkpoint.record import config_hash, model_config_record
from titanlite.components.clock import Clock
from titanlite.components.metrics.file import FILE as METRICS_FILE
from titanlite.components.metrics.file import read_metrics
from titanlite.components.metrics.logger import MetricsLogger, tb_run_dir
from titanlite.components.nonfinite import NonFiniteGuard
from titanlite.components.optim import (
    build_lr_scheduler,
    clip_grad_norm_,
    reconcile_resumed_settings,
)
from titanlite.components.preemption import (
    StopRequest,
)
from titanlite.components.profiling import maybe_memory_snapshots, maybe_profile, oom_snapshot
from titanlite.config import loader as config_lib
from titanlite.config.schema import JobConfig
from titanlite.core import distributed
from titanlite.core.logging import logger
from titanlite.data import DatasetError, ShardSet, Tokenizer, build_dataloader
from titanlite.preflight import checks as preflight
from titanlite.trainer.pipeline_step import PipelineStep
from titanlite.trainer.validate import ValidationData, Validator

Microbatch = tuple[torch.Tensor, torch.Tensor]
StepHook = Callable[[int], None]


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
        self.config_text = config_lib.to_toml(job)  # saved, hashed and shown in TensorBoard
        self.preempted = 0  # the signal number that stopped train() early
        self.last_saved_step = -1
        self.stop_message = ""
        self.launch_start = time.perf_counter() if launch_start is None else launch_start
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
        dp_rank, dp_size = (
            (self.dp_mesh.get_local_rank(), self.dp_mesh.size()) if self.dp_mesh else (0, 1)
        )
        tokenizer = Tokenizer(pre.tokenizer_path)
        for source in (pre.dataset, pre.validation_dataset):
            if isinstance(source, ShardSet):
                self._verify_shards(source)
        assert pre.dataset is not None  # None only in a dry run
        self.dataloader = build_dataloader(
            pre.dataset,
            tokenizer,
            seq_len=t.seq_len,
            local_batch_size=t.local_batch_size,
            dp_rank=dp_rank,
            dp_size=dp_size,
            seed=self.seed,
            text_field=t.dataset_text_field,
            # Every rank reads the same text stream in step: all of them share tokenizing it.
            tokenize_group=dist.group.WORLD if dist.get_world_size() > 1 else None,
        )
        self.validation_data = None
        if v.enabled:
            assert pre.validation_dataset is not None
            self.validation_data = ValidationData(
                pre.validation_dataset,
                tokenizer,
                v.seq_len or t.seq_len,
                v.local_batch_size or t.local_batch_size,
                dp_rank,
                dp_size,
                v.steps,
                t.dataset_text_field,
            )

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
        if built.float8_plan is not None:
            logger.info(built.float8_plan.describe())
        if built.pipeline_summary:
            logger.info(built.pipeline_summary)
        self.model = build.materialize(built, self.device, self.seed)
        if job.model.print_after_conversion and self.rank == 0:
            logger.info(f"model after parallelization:\n{self.model}")
        self.loss_parallel = built.loss_parallel
        self.sequence_shards = built.sequence_shards
        self.loss_fn = build.build_loss_fn(job)
        self.pipeline = None
        if self.dims.pp_enabled:
            self.pipeline = PipelineStep(
                built,
                self.meshes.get("pp"),
                self.device,
                t.local_batch_size,
                self.loss_fn,
                build.pipeline_options(job),
            )
        # Under block_causal the model cannot see across a document boundary, so the target
        # there (a document's first token) gets no loss either.
        self.boundary_bos_id = (
            pre.model_args.bos_id if job.model.attn_mask_type == "block_causal" else None
        )
        param_dtype = built.options.param_dtype
        # FSDP casts parameters itself; without it, autocast gives the same compute dtype.
        self.amp = (
            torch.autocast(self.device.type, dtype=param_dtype)
            if not self.dims.fsdp_enabled and param_dtype != torch.float32
            else contextlib.nullcontext()
        )
        self.optimizer = build.build_optimizer(job, built)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, job.lr_scheduler, t.steps)
        self.grad_accum_steps = pre.grad_accum_steps
        self.params = [q for q in self.model.parameters() if q.requires_grad]
        self.validator = None
        if self.validation_data is not None:
            self.validator = Validator(
                job.validation,
                self.validation_data,
                self.model,
                self.loss_fn,
                self.device,
                self.loss_parallel,
                self.amp,
                self.global_sum,
                self.boundary_bos_id,
                forward_loss=self.pipeline.evaluate if self.pipeline is not None else None,
                sequence_shards=self.sequence_shards,
            )

    def _build_checkpoint_and_metrics(self) -> None:
        job, pre, t = self.job, self.pre, self.job.training
        self.train_state = TrainState()
        self.nonfinite = NonFiniteGuard(t.skip_nonfinite_steps)
        self.checkpointer = CheckpointManager(
            job.checkpoint,
            self.dump_folder,
            model=self.model,
            optimizer=self.optimizer,
            lr_scheduler=self.lr_scheduler,
            dataloader=self.dataloader,
            train_state=self.train_state,
            config_hash=config_hash(self.config_text),
            total_steps=t.steps,
            model_config=model_config_record(
                job.model.name, job.model.flavor, pre.model_args, pre.tokenizer_path
            ),
            model_args=pre.model_args,
        )
        if not job.checkpoint.create_seed_checkpoint and self.checkpointer.load():
            logger.info(f"resuming at step {self.train_state.step}")
        resumed = self.checkpointer.resumed_from is not None
        if resumed:
            self._reconcile_resumed_settings()
        if self.rank == 0:  # after the resume: it records what actually runs
            config_lib.save_resolved(self.dump_folder, self.config_text)
        # Steps up to here were trained by an earlier launch past its last checkpoint: this
        # launch trains them again (lost time for goodput).
        clock = Clock(self.launch_start, last_logged_step(self.dump_folder) if resumed else 0)
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
            clock=clock,
        )
        if self.pipeline is not None:
            self.metrics.pp_group = self.pipeline.pp_group
        self.clock = clock
        logger.info(
            f"training {t.steps} steps: {t.local_batch_size} x {t.seq_len} tokens per rank per "
            f"micro-batch, {self.grad_accum_steps} micro-batch(es) per step, data-parallel degree "
            f"{self.dims.dp_size}, {t.local_batch_size * self.dims.dp_size * self.grad_accum_steps} "
            "sequences per step"
        )

    def _reconcile_resumed_settings(self) -> None:
        """One warning per [optimizer] setting where the checkpoint and the config disagree;
        the checkpoint's value continues (exact resume) unless the user asked otherwise, and the
        job config is updated to say what runs."""
        cfg, apply = self.job.optimizer, self.job.checkpoint.apply_new_optimizer_settings
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
                setattr(cfg, key, saved)
        if differences and not apply:
            self.config_text = config_lib.to_toml(self.job)
            self.checkpointer.config_hash = config_hash(self.config_text)

    def _verify_shards(self, shards: ShardSet) -> None:
        """Checksum every prepared shard before training, the ranks sharing the reading."""
        start = time.perf_counter()
        problems = distributed.shared_check(len(shards.shards), shards.verify_checksums)
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
                    y = build.ignore_boundary_targets(y, self.boundary_bos_id)
                batches.append(
                    (x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True))
                )
            return batches

    def train_step(
        self, microbatches: list[Microbatch]
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimizer step over the micro-batches: (this rank's share of the loss, grad norm,
        LR used); the shares' mean over data-parallel ranks is the step's loss."""
        self.optimizer.zero_grad(set_to_none=True)
        n = len(microbatches)
        batches = [build.local_batch(self.sequence_shards, x, y) for x, y in microbatches]
        # Every counted target of the global batch weighs 1 / (their global number). Gradients
        # are averaged over the ranks holding different tokens (FSDP over dp_shard x cp, DDP),
        # hence the factor loss_ranks.
        counted = sum((labels != build.IGNORE_INDEX).sum() for *_, labels in batches)
        global_counted = max(int(self.global_sum(torch.as_tensor(counted))), 1)
        scale = self.dims.loss_ranks / global_counted
        sync_each = self.job.parallelism.fsdp_sync_grads_each_microbatch
        loss_sum = torch.zeros((), device=self.device)
        for i, (inputs, tokens, labels) in enumerate(batches):
            if self.pipeline is not None:
                with loss_context(self.loss_parallel), self.amp:
                    loss_sum += self.pipeline(inputs, labels, scale, tokens)
                continue
            if self.dims.fsdp_enabled and not sync_each:
                # One reduce-scatter per step instead of one per micro-batch, for more memory.
                cast(FSDPModule, self.model).set_requires_gradient_sync(i == n - 1)
            with loss_context(self.loss_parallel):
                with self.amp:
                    logits = self.model(inputs, **build.model_kwargs(tokens))
                    loss = self.loss_fn(logits, labels) * scale
                loss.backward()
            loss_sum += (loss.full_tensor() if isinstance(loss, DTensor) else loss).detach()
        if self.pipeline is not None:
            loss_sum = self.pipeline.share_loss(loss_sum)
        grad_norm = clip_grad_norm_(
            self.params,
            self.job.training.max_norm,
            pp_group=self.pipeline.pp_group if self.pipeline is not None else None,
        )
        lr = float(self.lr_scheduler.get_last_lr()[0])
        if self.nonfinite.allow_update(self.train_state.step, grad_norm):
            self.optimizer.step()
            self.lr_scheduler.step()
        return loss_sum, grad_norm, lr

    def global_sum(self, value: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks holding different tokens, data- and context-parallel (a copy; the
        value itself is left alone)."""
        value = value.clone()
        if self.meshes.dp_cp is not None:
            dist.all_reduce(value, group=self.meshes.dp_cp.get_group())
        return value

    def global_mean(self, value: torch.Tensor) -> float:
        """Mean over those ranks (gloo has no AVG: sum, then divide)."""
        return (self.global_sum(value) / self.dims.loss_ranks).item()

    def validate(self, step: int) -> float | None:
        """The validation loss when it is due at `step` (its time is kept out of tps)."""
        if self.validator is None or not self.validator.due(step, self.job.training.steps):
            return None
        with self.clock.span("validation"):
            return self.validator.run()

    def save_seed_checkpoint(self) -> None:
        self.checkpointer.save(0, weights_only=True)
        logger.info(f"seed checkpoint written to {self.checkpointer.folder / 'step-0'}")

    def train(self, stop: StopRequest | None = None) -> list[dict]:
        """The loop; `self.preempted` is the signal number that stopped it early, else 0."""
        state, records = self.train_state, []
        stop = stop or StopRequest()
        stop.arm()
        gc.disable()
        gc.collect()
        data_iter = iter(self.dataloader)
        distributed.set_timeout(self.job.comm.train_timeout_seconds)
        self.clock.start_training()
        with self._step_end_hooks(stop) as hooks:
            while state.step < self.job.training.steps and not self.preempted:
                state.step += 1
                self.clock.step_begin()
                microbatches = self.next_microbatches(data_iter)
                with hooks.oom_snapshot(state.step):
                    loss, grad_norm, lr = self.train_step(microbatches)
                state.tokens_seen += self.tokens_per_step
                self.metrics.count_step()
                val_loss = self.validate(state.step)
                # Reading the loss syncs with the device: only on the steps that log it.
                if self.metrics.should_log(state.step) or val_loss is not None:
                    loss_value = self.global_mean(loss)
                    records.append(
                        self.metrics.log(
                            state.step,
                            loss_value,
                            grad_norm.item(),
                            lr,
                            val_loss,
                            skipped_steps=self.nonfinite.skipped,
                        )
                    )
                state.elapsed_s += self.clock.step_end(state.step)
                for hook in hooks:
                    hook(state.step)
        stop.restore()
        with self.clock.span("checkpoint"):
            self.checkpointer.wait()
            # Only by the launch that saved the final step: a relaunch that resumes there
            # trains nothing and finds the export already written.
            if (
                self.job.checkpoint.last_save_in_hf
                and self.last_saved_step == self.job.training.steps
            ):
                self.checkpointer.export_hf(self.last_saved_step)
        if not self.preempted:
            logger.info(f"training done: {state.step} steps, {state.tokens_seen:,} tokens")
        self.metrics.log_goodput(state.step)
        return records

    @contextlib.contextmanager
    def _step_end_hooks(self, stop: StopRequest) -> Iterator[StepHooks]:
        """What runs after every step, in this order: save when due, profiler, memory
        snapshots, gc, and last the preemption agreement (which may save once more)."""
        job, rank = self.job, self.rank
        with (
            maybe_profile(job.profiling, self.dump_folder, rank) as profiler,
            maybe_memory_snapshots(job.profiling, self.dump_folder, rank) as snapshots,
        ):
            hooks = StepHooks(snapshots)
            hooks.append(self._save_if_due)
            if profiler is not None:
                hooks.append(lambda step: profiler.step())
            if snapshots is not None:
                hooks.append(snapshots.step)
            hooks.append(self._collect_garbage)
            hooks.append(lambda step: self._stop_if_agreed(stop, step))
            yield hooks

    def _save_if_due(self, step: int) -> None:
        if self.checkpointer.should_save(step):
            self._timed_save(step)

    def _collect_garbage(self, step: int) -> None:
        # Automatic gc is off during training: its pauses would land on random ranks at random
        # steps and stall the collectives; here every rank pauses at the same step.
        if step % self.job.training.gc_freq == 0:
            gc.collect(1)

    def _timed_save(self, step: int, **kwargs) -> None:
        with self.clock.span("checkpoint"):
            self.checkpointer.save(step, **kwargs)
        self.last_saved_step = step

    def _stop_if_agreed(self, stop: StopRequest, step: int) -> None:
        """Every rank calls this at the same step. On an agreed signal: finish any background
        save, then save this step synchronously (the job may be killed soon after), unless it
        was just saved or training is over anyway."""
        signum = stop.agreed()
        if not signum or step >= self.job.training.steps:
            return
        self.preempted = signum
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if not self.job.checkpoint.enable_checkpoint:
            self.stop_message = (
                f"{name}: stopped after step {step} WITHOUT a checkpoint "
                "(checkpoint.enable_checkpoint is off): a restart begins at step 0"
            )
            logger.warning(self.stop_message)
            return
        with self.clock.span("checkpoint"):
            self.checkpointer.wait()
        if self.last_saved_step != step:
            self._timed_save(step, force_sync=True)
        self.stop_message = (
            f"{name}: stopped after step {step}; checkpoint "
            f"{self.checkpointer.folder / f'step-{step}'} is complete"
        )
        logger.info(self.stop_message)

    def close(self) -> None:
        self.checkpointer.close()
        self.metrics.close()
        gc.enable()
        if dist.is_initialized():
            dist.destroy_process_group()


class StepHooks(list[StepHook]):
    """The ordered step-end hooks, and the OOM guard that dumps a memory snapshot."""

    def __init__(self, snapshots) -> None:
        super().__init__()
        self.snapshots = snapshots

    def oom_snapshot(self, step: int) -> contextlib.AbstractContextManager:
        return oom_snapshot(self.snapshots, step)


def last_logged_step(dump_folder: Path) -> int:
    """The highest step in metrics.jsonl (0 if none): how far earlier launches got. A torn line
    (a crash mid-write) is skipped: it must not make a good checkpoint unusable."""
    path = dump_folder / METRICS_FILE
    return max(read_metrics(path), default=0) if path.exists() else 0
