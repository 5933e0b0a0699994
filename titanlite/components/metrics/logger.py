"""Training metrics: a console line, metrics.jsonl, TensorBoard and Weights & Biases scalars
(wandb_run.py), all with the same values. MFU is reported only where the device's peak is known; on CPU it is null.

TensorBoard: `{dump_folder}/{save_tb_folder}/run-TIME/` (rank_N/ below it for every rank with
metrics.save_for_all_ranks), one folder per run: a launch that resumes from a checkpoint writes
into the latest folder, on the global step axis, and hides the curves' points after the
checkpoint that it trains again (purge_step). Tags are grouped as in docs/monitoring.md."""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from titanlite.components.clock import Clock
from titanlite.config.schema import Metrics
from titanlite.core.errors import COLOR_ENV
from titanlite.core.logging import logger

# Dense bf16 tensor-core peak FLOP/s per device, keyed by the exact torch.cuda.get_device_name()
# string. Exact names, not fragments: "H100" alone covers SXM (989 TFLOP/s), PCIe (756) and NVL
# (835), and "L4" is a prefix of "L40" and "L40S"; a wrong peak would give a wrong MFU, while an
# unknown name gives none (and a warning naming metrics.peak_flops). Figures are the data
# sheets' bf16 numbers without sparsity (the sheets print the 2:4-sparse figure, twice these):
#   H100 SXM5 989.4, H100 PCIe 756, H100 NVL 835.5 (NVIDIA H100 datasheet);
#   H200 SXM 989.4, H200 NVL 835.5 (NVIDIA H200 datasheet); B200 2,250 (HGX B200: 36 PFLOPS
#   sparse for 8 GPUs); A100 312, all four forms (NVIDIA A100 datasheet: 40/80 GB, SXM4/PCIe
#   share the peak); L4 121, L40 181.05, L40S 362.05 (NVIDIA L4/L40/L40S datasheets);
#   MI300X 1,307.4 (AMD Instinct MI300X data sheet); MI250X 383 per module, which ROCm shows
#   as two devices (one per GCD), so 191.5 per device (AMD Instinct MI250X data sheet).
PEAK_BF16_FLOPS = {
    "NVIDIA H100 80GB HBM3": 989.4e12,  # SXM5
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H100 NVL": 835.5e12,
    "NVIDIA H200": 989.4e12,  # SXM
    "NVIDIA H200 NVL": 835.5e12,
    "NVIDIA B200": 2.25e15,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100-PCIE-40GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
    "NVIDIA L4": 121e12,
    "NVIDIA L40": 181.05e12,
    "NVIDIA L40S": 362.05e12,
    "AMD Instinct MI300X": 1307.4e12,
    "AMD Instinct MI250X": 191.5e12,  # per GCD
}


def peak_flops(device: torch.device, override: float | None) -> float | None:
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    peak = PEAK_BF16_FLOPS.get(name.strip())
    if peak is None:
        logger.warning(
            f"peak FLOP/s of {name!r} unknown: MFU will be null (set metrics.peak_flops to the "
            "device's dense bf16 peak)"
        )
    return peak


def memory_peaks(device: torch.device) -> dict[str, float]:
    """Peak memory since the last call. On CUDA, `memory_gib` is what tensors held at the peak
    and `memory_reserved_gib` what the caching allocator held from the device (tensors, cached
    free blocks and fragmentation: what an out-of-memory error is about). On CPU, `memory_gib`
    is the process's peak RSS, which already is what it took from the system: no second key."""
    if device.type == "cuda":
        peaks = {
            "memory_gib": torch.cuda.max_memory_allocated(device) / 2**30,
            "memory_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30,
        }
        torch.cuda.reset_peak_memory_stats(device)
        return peaks
    return {"memory_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30}


# metrics.jsonl key -> TensorBoard tag.
TB_TAGS = {
    "loss": "loss/train",
    "loss_mtp": "loss/mtp",
    "tps": "throughput/tps",
    "tflops": "throughput/tflops",
    "mfu": "throughput/mfu_pct",
    "memory_gib": "memory/peak_gib",
    "memory_reserved_gib": "memory/peak_reserved_gib",
    "step_time_s": "time/step_s",
    "data_loading_pct": "time/data_loading_pct",
    "checkpoint_blocked_s": "time/checkpoint_blocked_s",
    "eval_time_s": "time/eval_s",
    "lr": "optim/lr",
    "grad_norm": "optim/grad_norm",
    "val_loss": "loss/validation",
    "skipped_steps": "optim/skipped_steps",
    "moe_aux_loss": "moe/aux_loss",
    "moe_imbalance_max": "moe/imbalance_max",
}
# metrics.jsonl key of a {name: value} figure -> the TensorBoard tag its names go under.
TB_GROUPS = {"moe_imbalance": "moe/imbalance", "data_share": "data/share"}
# metrics.jsonl key prefix of a family of figures (<prefix><name>) -> their TensorBoard tag.
TB_PREFIXES = {"val_loss_": "loss/validation", "tokens_": "data/tokens", "eval/": "eval"}


def _named_losses(record: dict[str, Any]) -> str:
    """(web 2.1234, code 1.9876): each named held-out set's loss, for the console."""
    named = {k[len("val_loss_") :]: v for k, v in record.items() if k.startswith("val_loss_")}
    return f" ({', '.join(f'{n} {v:.4f}' for n, v in named.items())})" if named else ""


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"


def color_terminal() -> bool:
    """The log ends on a terminal: colour codes in a file or a pipe are noise. A rank's stderr
    is torchrun's file, so titanlite.launch tells the ranks what its own stderr is."""
    told = os.environ.get(COLOR_ENV)
    return told == "1" if told is not None else sys.stderr.isatty()


def eta_text(seconds: float) -> str:
    """H:MM:SS, hours unbounded (gmtime would wrap at a day, and overflow on a huge one)."""
    if not math.isfinite(seconds):
        return "n/a"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def tb_run_dir(root: Path, resumed: bool) -> Path:
    """A new timestamped run folder, or for a resumed run the latest one (same curves)."""
    runs = sorted(p for p in root.glob("run-*") if p.is_dir()) if root.exists() else []
    if resumed and runs:
        return runs[-1]
    return root / f"run-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


class MetricsLogger:
    """Collects per-step figures and writes them every `log_freq` steps (rank 0 writes files)."""

    def __init__(
        self,
        cfg: Metrics,
        dump_folder: Path,
        device: torch.device,
        write_files: bool,
        flops_per_token: int,
        tokens_per_step_per_device: float,
        total_steps: int,
        start_step: int = 0,
        rank: int = 0,
        config_text: str = "",
        tb_dir: Path | None = None,
        clock: Clock | None = None,
        pp_group: dist.ProcessGroup | None = None,
    ):
        """`pp_group`: the pipeline stages' group under pipeline parallel (a peak per stage)."""
        self.cfg, self.device, self.start_step = cfg, device, start_step
        self.pp_group = pp_group
        self.flops_per_token, self.total_steps = flops_per_token, total_steps
        self.tokens_per_step = tokens_per_step_per_device
        self.peak = peak_flops(device, cfg.peak_flops)
        self.jsonl = self.tb = self.wandb = None
        if write_files:
            dump_folder.mkdir(parents=True, exist_ok=True)
            path = dump_folder / "metrics.jsonl"
            earlier = path.exists() and path.stat().st_size > 0
            torn = earlier and not _ends_with_newline(path)
            if earlier and start_step == 0:  # a fresh start in a used folder, not a resume
                logger.warning(
                    f"{path} already holds an earlier run's steps: this run appends its own "
                    "after them (a new --job.dump_folder keeps runs apart)"
                )
            self.jsonl = path.open("a", buffering=1)
            if torn:  # a crash mid-write: the next record starts on a line of its own
                self.jsonl.write("\n")
        if (
            cfg.enable_tensorboard
            and tb_dir is not None
            and (write_files or cfg.save_for_all_ranks)
        ):
            from torch.utils.tensorboard import SummaryWriter

            if cfg.save_for_all_ranks:
                tb_dir = tb_dir / f"rank_{rank}"
            # purge_step: points at or after it from an earlier launch are steps this one
            # trains again (after a restart), and TensorBoard hides them.
            self.tb = SummaryWriter(log_dir=str(tb_dir), purge_step=start_step + 1)
            if start_step == 0 and config_text:
                self.tb.add_text("config", "```toml\n" + config_text + "\n```", 0)
        if cfg.enable_wandb and write_files:
            from titanlite.components.metrics.wandb_run import WandbRun

            self.wandb = WandbRun(dump_folder, config_text)
        self.clock = clock or Clock()
        self.start = time.perf_counter()
        self.window_steps = 0

    def should_log(self, step: int) -> bool:
        first = step == self.start_step + 1
        return first or step % self.cfg.log_freq == 0 or step == self.total_steps

    def count_step(self) -> None:
        self.window_steps += 1

    def log(
        self,
        step: int,
        loss: float,
        grad_norm: float,
        lr: float,
        validation: dict[str, float] | None = None,
        skipped_steps: int = 0,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        now = time.perf_counter()
        window = self.clock.window
        elapsed = self.clock.window_seconds(now)
        tps = self.tokens_per_step * self.window_steps / elapsed
        tflops = self.flops_per_token * tps / 1e12
        record: dict[str, Any] = {
            "step": step,
            "loss": loss,
            "grad_norm": grad_norm,
            "lr": lr,
            "tps": tps,
            "tflops": tflops,
            "mfu": None if self.peak is None else 100 * tflops * 1e12 / self.peak,
            **memory_peaks(self.device),
            "data_loading_pct": 100 * window["data"] / elapsed,
            "step_time_s": elapsed / max(1, self.window_steps),
            # The part of saves that training waited for (async saves return after staging).
            "checkpoint_blocked_s": window["checkpoint"],
            "elapsed_s": now - self.start,
            "skipped_steps": skipped_steps,  # non-finite updates skipped so far (this launch)
        }
        record.update(validation or {})  # only on the steps that validated
        record.update(extra or {})
        if self.pp_group is not None:
            # Pipeline stages hold different layers, activations and micro-batches in flight:
            # each stage's peak (its first-ranked process's, pp ranks ordered by stage).
            mine = torch.tensor([record["memory_gib"]], dtype=torch.float64)
            stages = [torch.zeros_like(mine) for _ in range(dist.get_world_size(self.pp_group))]
            dist.all_gather(stages, mine, group=self.pp_group)
            record["memory_gib_stages"] = [float(m) for m in stages]
        eta = (now - self.start) / max(1, step - self.start_step) * (self.total_steps - step)
        self._write(record, eta)
        self.clock.reset_window(now)
        self.window_steps = 0
        return record

    def _write(self, r: dict[str, Any], eta: float) -> None:
        mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.1f}%"
        colored = not self.cfg.disable_color_printing and color_terminal()
        color = ("\033[32m", "\033[0m") if colored else ("", "")
        logger.info(
            f"{color[0]}step {r['step']:>6}{color[1]}  loss {r['loss']:.4f}  "
            + (f"loss_mtp {r['loss_mtp']:.4f}  " if "loss_mtp" in r else "")
            + f"grad_norm {r['grad_norm']:.3f}  lr {r['lr']:.2e}  tps {r['tps']:,.0f}  "
            f"tflops {r['tflops']:.2f}  mfu {mfu}  mem {r['memory_gib']:.2f}GiB  "
            + (
                f"(reserved {r['memory_reserved_gib']:.2f}GiB)  "
                if "memory_reserved_gib" in r
                else ""
            )
            + (
                f"(stages {'/'.join(f'{m:.2f}' for m in r['memory_gib_stages'])})  "
                if "memory_gib_stages" in r
                else ""
            )
            + f"data {r['data_loading_pct']:.1f}%  eta {eta_text(eta)}"
            + (f"  val_loss {r['val_loss']:.4f}" if "val_loss" in r else "")
            + _named_losses(r)
            + (f"  moe imbalance {r['moe_imbalance_max']:.2f}" if "moe_imbalance_max" in r else "")
        )
        if self.jsonl is not None:
            # Strict JSON: a non-finite figure (a skipped step's loss) is null, not NaN.
            self.jsonl.write(json.dumps({k: finite_or_none(v) for k, v in r.items()}) + "\n")
        scalars = {tag: r[key] for key, tag in TB_TAGS.items() if r.get(key) is not None}
        for stage, gib in enumerate(r.get("memory_gib_stages", [])):
            scalars[f"memory/stage{stage}_peak_gib"] = gib
        for key, prefix in TB_GROUPS.items():
            scalars.update({f"{prefix}/{name}": v for name, v in r.get(key, {}).items()})
        for start, prefix in TB_PREFIXES.items():
            scalars.update(
                {f"{prefix}/{k[len(start) :]}": v for k, v in r.items() if k.startswith(start)}
            )
        if self.tb is not None:
            for tag, value in scalars.items():
                self.tb.add_scalar(tag, value, r["step"])
        if self.wandb is not None:
            self.wandb.log(r["step"], scalars)

    def log_goodput(self, step: int) -> None:
        """The launch's goodput (where its wall time went) on the console and in TensorBoard."""
        goodput = self.clock.goodput()
        parts = ", ".join(
            f"{k.removesuffix('_s')} {v:.1f}s"
            for k, v in goodput.items()
            if k.endswith("_s") and k != "wall_s"
        )
        logger.info(f"goodput {goodput['goodput_pct']:.1f}% of {goodput['wall_s']:.1f}s ({parts})")
        if self.tb is not None:
            for key, value in goodput.items():
                self.tb.add_scalar(f"goodput/{key}", value, step)
        if self.wandb is not None:
            self.wandb.log(step, {f"goodput/{key}": value for key, value in goodput.items()})

    def close(self) -> None:
        if self.jsonl is not None:
            self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.close()
