"""The trainer: where the config sections meet. `python -m titanlite.train --config PATH [...]`.

Flow: config + preflight checks (no process group yet) -> process group and mesh -> tokenizer
and loader -> model on the meta device -> parallelize (TP, AC, compile, FSDP) -> materialize
and initialize the local shards -> optimizer on the sharded parameters -> the loop.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from models import MODELS
from parallelisms import PARALLELIZE_FNS, ParallelizeOptions, loss_context
from parallelisms.float8 import register_scale_precompute
from titanlite import config as config_lib
from titanlite import distributed, preflight
from titanlite.checkpoint import CheckpointManager, config_hash, model_config_record
from titanlite.config_schema import JobConfig
from titanlite.data import DatasetError, ShardSet, Tokenizer, build_dataloader
from titanlite.float8 import float8_options
from titanlite.logging import init_logger, logger
from titanlite.metrics import MetricsLogger, tb_run_dir
from titanlite.optim import build_lr_scheduler, build_optimizer, clip_grad_norm_
from titanlite.preemption import PREEMPTED_EXIT_CODE, StopRequest, requeue_slurm_job
from titanlite.profiling import maybe_memory_snapshots, maybe_profile
from titanlite.validate import ValidationData, Validator

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parallelize_options(job: JobConfig, dims, device_type: str) -> ParallelizeOptions:
    """The parallelize knobs from the config sections (shared by training and the dry run)."""
    t, p, ac = job.training, job.parallelism, job.activation_checkpoint
    f8 = float8_options(job, fsdp_enabled=dims.fsdp_enabled, device_type=device_type)
    return ParallelizeOptions(
        loss_parallel=dims.tp_enabled and not p.disable_loss_parallel,
        async_tp=p.enable_async_tensor_parallel,
        ac_mode=ac.mode,
        ac_option=ac.selective_ac_option,
        compile=t.compile,
        param_dtype=DTYPES[t.mixed_precision_param],
        reduce_dtype=DTYPES[t.mixed_precision_reduce],
        reshard_after_forward=p.fsdp_reshard_after_forward,
        cpu_offload=t.enable_cpu_offload,
        float8=f8,
    )


class TrainState:
    """What the loop itself must carry across a resume."""

    def __init__(self) -> None:
        self.step, self.tokens_seen, self.elapsed_s = 0, 0, 0.0

    def state_dict(self) -> dict:
        return {"step": self.step, "tokens_seen": self.tokens_seen, "elapsed_s": self.elapsed_s}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.tokens_seen = int(state["step"]), int(state["tokens_seen"])
        self.elapsed_s = float(state["elapsed_s"])


def cross_entropy_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    # In float32 whatever the compute dtype: a bf16 log-softmax over 128K classes loses bits.
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


class Trainer:
    def __init__(self, job: JobConfig, pre: preflight.Preflight, launch_start: float | None = None):
        self.job, self.pre = job, pre
        self.config_text = config_lib.to_toml(job)  # saved, hashed and shown in TensorBoard
        self.preempted = 0  # the signal number that stopped train() early
        # For goodput: start-up (imports, process group, model init, loading) counts as lost.
        self.launch_start = time.perf_counter() if launch_start is None else launch_start
        t = job.training
        self.device = distributed.init(job.comm.init_timeout_seconds)
        self.rank = dist.get_rank()
        distributed.check_distinct_devices(self.device)
        self.dims = pre.dims
        self.meshes = self.dims.build_meshes(self.device.type)
        self._log_layout()
        self.seed = distributed.agree_on_seed(t.seed)
        distributed.set_determinism(self.seed, t.deterministic)
        self.dump_folder = Path(job.job.dump_folder)
        if self.rank == 0:
            self._save_resolved_config()

        dp_mesh = self.dp_mesh = self.meshes.dp
        dp_rank, dp_size = (dp_mesh.get_local_rank(), dp_mesh.size()) if dp_mesh else (0, 1)
        tokenizer = Tokenizer(pre.tokenizer_path)
        for source in (pre.dataset, pre.validation_dataset):
            if isinstance(source, ShardSet):
                self._verify_shards(source)
        self.dataloader = build_dataloader(
            pre.dataset,
            tokenizer,
            seq_len=t.seq_len,
            local_batch_size=t.local_batch_size,
            dp_rank=dp_rank,
            dp_size=dp_size,
            seed=self.seed,
            text_field=t.dataset_text_field,
        )
        v = job.validation
        self.validation_data = (
            None
            if not v.enabled
            else ValidationData(
                pre.validation_dataset,
                tokenizer,
                v.seq_len or t.seq_len,
                v.local_batch_size or t.local_batch_size,
                dp_rank,
                dp_size,
                v.steps,
                t.dataset_text_field,
            )
        )

        spec = MODELS[job.model.name]
        with torch.device("meta"):
            model = spec.model_cls(pre.model_args)
        n_params = spec.num_params(pre.model_args)
        self.flops_per_token = spec.training_flops_per_token(pre.model_args, t.seq_len)
        logger.info(
            f"model {job.model.name} {job.model.flavor}: {n_params:,} parameters, "
            f"{self.flops_per_token / 1e9:.3f} GFLOPs per token (training), seed {self.seed}"
        )
        self.param_dtype = DTYPES[t.mixed_precision_param]
        opts = parallelize_options(job, self.dims, self.device.type)
        self.loss_parallel = opts.loss_parallel
        float8_plan = PARALLELIZE_FNS[job.model.name](model, self.dims, self.meshes, opts)
        if float8_plan is not None:
            logger.info(float8_plan.describe())
        init_device = torch.device("cpu") if t.enable_cpu_offload else self.device
        model.to_empty(device=init_device)
        model.init_weights(self.seed, buffer_device=self.device)
        model.train()
        self.model = model
        if job.model.print_after_conversion and self.rank == 0:
            logger.info(f"model after parallelization:\n{model}")

        self.loss_fn = torch.compile(cross_entropy_loss) if t.compile else cross_entropy_loss
        # FSDP casts parameters itself; without it, autocast gives the same compute dtype.
        self.amp = (
            torch.autocast(self.device.type, dtype=self.param_dtype)
            if not self.dims.fsdp_enabled and self.param_dtype != torch.float32
            else contextlib.nullcontext()
        )
        self.optimizer = build_optimizer(model, job.optimizer)
        if opts.float8 is not None and opts.float8.precompute_scale:
            register_scale_precompute(self.optimizer, model)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, job.lr_scheduler, t.steps)
        self.grad_accum_steps = pre.grad_accum_steps
        self.validator = (
            None
            if self.validation_data is None
            else Validator(
                job.validation,
                self.validation_data,
                model,
                self.loss_fn,
                self.device,
                self.loss_parallel,
                self.amp,
                self.global_mean,
            )
        )
        self.params = [q for q in model.parameters() if q.requires_grad]
        self.train_state = TrainState()
        self.checkpointer = CheckpointManager(
            job.checkpoint,
            self.dump_folder,
            model=model,
            optimizer=self.optimizer,
            lr_scheduler=self.lr_scheduler,
            dataloader=self.dataloader,
            train_state=self.train_state,
            config_hash=config_hash(self.config_text),
            total_steps=t.steps,
            model_config=model_config_record(
                job.model.name, job.model.flavor, pre.model_args, pre.tokenizer_path
            ),
        )
        if not job.checkpoint.create_seed_checkpoint and self.checkpointer.load():
            logger.info(f"resuming at step {self.train_state.step}")
        tokens_per_device = t.local_batch_size * t.seq_len * self.grad_accum_steps / self.dims.tp
        # Steps up to here were trained by an earlier launch past its last checkpoint: this
        # launch trains them again (lost time for goodput).
        self.redo_until = (
            last_logged_step(self.dump_folder) if self.checkpointer.resumed_from else 0
        )
        self.metrics = MetricsLogger(
            job.metrics,
            self.dump_folder,
            self.device,
            write_files=self.rank == 0,
            flops_per_token=self.flops_per_token,
            tokens_per_step_per_device=tokens_per_device,
            total_steps=t.steps,
            start_step=self.train_state.step,
            rank=self.rank,
            config_text=self.config_text,
            tb_dir=tb_run_dir(
                self.dump_folder / job.metrics.save_tb_folder,
                resumed=self.checkpointer.resumed_from is not None,
            ),
        )
        logger.info(
            f"training {t.steps} steps: {t.local_batch_size} x {t.seq_len} tokens per rank per "
            f"micro-batch, {self.grad_accum_steps} micro-batch(es) per step, data-parallel degree "
            f"{self.dims.dp_size}, {t.local_batch_size * self.dims.dp_size * self.grad_accum_steps} "
            "sequences per step"
        )

    def _log_layout(self) -> None:
        """The rank -> device -> mesh coordinate map, once, on rank 0."""
        world = self.meshes.world
        mine = f"rank {self.rank} -> {self.device} -> {dict(zip(world.mesh_dim_names, world.get_coordinate()))}"
        everyone: list[str] = [""] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        if self.rank == 0:
            logger.info(f"mesh {self.dims.describe()}:\n  " + "\n  ".join(everyone))

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

    def _save_resolved_config(self) -> None:
        self.dump_folder.mkdir(parents=True, exist_ok=True)
        path, text = self.dump_folder / "config.toml", self.config_text
        if path.exists() and path.read_text() != text:
            kept = path.with_name(f"config.{int(path.stat().st_mtime)}.toml")
            path.rename(kept)
            logger.info(f"an earlier run's config kept as {kept}")
        path.write_text(text)

    def next_microbatches(self, data_iter) -> list[tuple[torch.Tensor, torch.Tensor]]:
        start = time.perf_counter()
        batches = []
        for _ in range(self.grad_accum_steps):
            inputs, labels = next(data_iter)
            batches.append(
                (
                    inputs.to(self.device, non_blocking=True),
                    labels.to(self.device, non_blocking=True),
                )
            )
        self.last_data_s = time.perf_counter() - start
        self.metrics.add_data_time(self.last_data_s)
        return batches

    def train_step(
        self, microbatches: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimizer step over the micro-batches: (summed loss, grad norm, LR used)."""
        self.optimizer.zero_grad(set_to_none=True)
        n = len(microbatches)
        sync_each = self.job.parallelism.fsdp_sync_grads_each_microbatch
        loss_sum = torch.zeros((), device=self.device)
        for i, (inputs, labels) in enumerate(microbatches):
            if self.dims.fsdp_enabled and not sync_each:
                # One reduce-scatter per step instead of one per micro-batch, for more memory.
                self.model.set_requires_gradient_sync(i == n - 1)
            with loss_context(self.loss_parallel):
                with self.amp:
                    logits = self.model(inputs)
                    loss = self.loss_fn(logits, labels) / n
                loss.backward()
            loss_sum += (loss.full_tensor() if isinstance(loss, DTensor) else loss).detach()
        grad_norm = clip_grad_norm_(self.params, self.job.training.max_norm)
        lr = self.lr_scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.lr_scheduler.step()
        return loss_sum, grad_norm, lr

    def global_mean(self, value: torch.Tensor) -> float:
        """Mean over data-parallel ranks (gloo has no AVG: sum, then divide)."""
        if self.dp_mesh is not None:
            value = value.clone()
            dist.all_reduce(value, group=self.dp_mesh.get_group())
            value /= self.dp_mesh.size()
        return value.item()

    def validate(self, step: int) -> float | None:
        """The validation loss when it is due at `step` (its time is kept out of tps)."""
        if self.validator is None or not self.validator.due(step, self.job.training.steps):
            return None
        start = time.perf_counter()
        val_loss = self.validator.run()
        self.last_val_s = time.perf_counter() - start
        self.metrics.exclude_time(self.last_val_s)
        return val_loss

    def save_seed_checkpoint(self) -> None:
        self.checkpointer.save(0, weights_only=True)
        logger.info(f"seed checkpoint written to {self.checkpointer.folder / 'step-0'}")

    def train(self, stop: StopRequest | None = None) -> list[dict]:
        """The loop; `self.preempted` is the signal number that stopped it early, else 0."""
        t, state = self.job.training, self.train_state
        stop = stop or StopRequest()
        stop.arm()
        gc.disable()
        gc.collect()
        data_iter = iter(self.dataloader)
        distributed.set_timeout(self.job.comm.train_timeout_seconds)
        tokens_per_step = t.local_batch_size * t.seq_len * self.grad_accum_steps * self.dims.dp_size
        records = []
        lost = self.lost = {
            "init_s": time.perf_counter() - self.launch_start,
            "data_s": 0.0,
            "checkpoint_s": 0.0,
            "redone_s": 0.0,
            "validation_s": 0.0,
        }
        productive = 0.0
        with (
            maybe_profile(self.job.profiling, self.dump_folder, self.rank) as profiler,
            maybe_memory_snapshots(self.job.profiling, self.dump_folder, self.rank) as snapshots,
        ):
            while state.step < t.steps:
                step_start = time.perf_counter()
                state.step += 1
                if state.step % t.gc_freq == 0:
                    gc.collect(1)
                microbatches = self.next_microbatches(data_iter)
                try:
                    loss, grad_norm, lr = self.train_step(microbatches)
                except torch.OutOfMemoryError:
                    if snapshots is not None:  # what filled the memory, before the error unwinds
                        snapshots.dump(f"iteration_{state.step}_oom")
                    raise
                state.tokens_seen += tokens_per_step
                self.metrics.count_step()
                self.last_val_s = 0.0
                val_loss = self.validate(state.step)
                # Reading the loss syncs with the device: only on the steps that log it.
                if self.metrics.should_log(state.step) or val_loss is not None:
                    records.append(
                        self.metrics.log(
                            state.step, self.global_mean(loss), grad_norm.item(), lr, val_loss
                        )
                    )
                step_s = time.perf_counter() - step_start
                state.elapsed_s += step_s
                lost["data_s"] += self.last_data_s
                lost["validation_s"] += self.last_val_s
                trained_s = step_s - self.last_data_s - self.last_val_s
                if state.step <= self.redo_until:
                    lost["redone_s"] += trained_s
                else:
                    productive += trained_s
                saved = self.checkpointer.should_save(state.step)
                if saved:
                    self._timed_save(state.step)
                if profiler is not None:
                    profiler.step()
                if snapshots is not None:
                    snapshots.step(state.step)
                if (signum := stop.agreed()) and state.step < t.steps:
                    self._stop_for_preemption(signum, saved)
                    break
        stop.restore()
        blocked_start = time.perf_counter()
        self.checkpointer.wait()
        lost["checkpoint_s"] += time.perf_counter() - blocked_start
        if not self.preempted:
            logger.info(f"training done: {state.step} steps, {state.tokens_seen:,} tokens")
        wall = time.perf_counter() - self.launch_start
        self.metrics.log_goodput(
            state.step,
            {
                "goodput_pct": 100 * productive / wall,
                "wall_s": wall,
                "productive_s": productive,
                **lost,
            },
        )
        return records

    def _timed_save(self, step: int, **kwargs) -> None:
        """Save, counting the time training is blocked in the metrics and in goodput."""
        blocked_start = time.perf_counter()
        self.checkpointer.save(step, **kwargs)
        blocked = time.perf_counter() - blocked_start
        self.metrics.add_checkpoint_time(blocked)
        self.lost["checkpoint_s"] += blocked

    def _stop_for_preemption(self, signum: int, saved: bool) -> None:
        """Every rank is here at the same step: finish any background save, then save this
        step synchronously (the job may be killed soon after), unless it was just saved."""
        self.preempted = signum
        step = self.train_state.step
        name = signal.Signals(signum).name
        if not self.job.checkpoint.enable_checkpoint:
            logger.warning(
                f"{name}: stopping after step {step} WITHOUT a checkpoint "
                "(checkpoint.enable_checkpoint is off): a restart begins at step 0"
            )
            return
        self.checkpointer.wait()
        if not saved:
            self._timed_save(step, force_sync=True)
        logger.info(
            f"{name}: stopped after step {step}; checkpoint "
            f"{self.checkpointer.folder / f'step-{step}'} is complete"
        )

    def close(self) -> None:
        self.checkpointer.close()
        self.metrics.close()
        gc.enable()
        if dist.is_initialized():
            dist.destroy_process_group()


def last_logged_step(dump_folder: Path) -> int:
    """The highest step in metrics.jsonl (0 if none): how far earlier launches got."""
    path = dump_folder / "metrics.jsonl"
    if not path.exists():
        return 0
    steps = [
        json.loads(line).get("step", 0) for line in path.read_text().splitlines() if line.strip()
    ]
    return max(steps, default=0)


def main(argv: list[str]) -> int:
    launch_start = time.perf_counter()
    init_logger()
    # First: a preemption notice during start-up must not kill the process (the default action
    # of SIGUSR1); it is honoured after the first step.
    stop = StopRequest()
    try:
        job, pre = preflight.run(argv, distributed.launched_world_size())
    except preflight.user_errors() as e:
        print(f"titanlite: error: {e}", file=sys.stderr)
        return 2
    if job.job.print_config or job.job.print_args:
        if os.environ.get("RANK", "0") == "0":
            print(config_lib.to_toml(job))
    try:
        trainer = Trainer(job, pre, launch_start)
    except preflight.user_errors() as e:  # e.g. a checkpoint that cannot be resumed
        print(f"titanlite: error: {e}", file=sys.stderr)
        return 2
    try:
        if job.checkpoint.create_seed_checkpoint:
            trainer.save_seed_checkpoint()
        else:
            trainer.train(stop)
    finally:
        trainer.close()
    if trainer.preempted:
        # After close(): the checkpoint is complete on every rank before SLURM (which a
        # requeue makes end this allocation) sends its own SIGTERM/SIGKILL.
        if job.job.requeue_on_preemption and os.environ.get("RANK", "0") == "0":
            requeue_slurm_job()
        return PREEMPTED_EXIT_CODE
    return 0


def cli() -> None:
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    cli()
