"""Training metrics: a console line, metrics.jsonl and TensorBoard scalars, all with the same
values. MFU is reported only where the device's peak is known; on CPU it is null."""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

import torch

from titanlite.config_schema import Metrics
from titanlite.logging import logger

# Dense bf16 peak FLOP/s by device name fragment (vendor data sheets, SXM variants).
PEAK_BF16_FLOPS = {
    "H200": 989e12, "H100": 989e12, "H800": 989e12, "GH200": 989e12, "B200": 2.25e15,
    "A100": 312e12, "A800": 312e12, "L40S": 362e12, "L4": 121e12, "A10G": 70e12,
    "MI300X": 1307e12, "MI250X": 383e12,
}


def peak_flops(device: torch.device, override: float | None) -> float | None:
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if key in name:
            return PEAK_BF16_FLOPS[key]
    logger.warning(f"peak FLOP/s of {name!r} unknown: MFU will be null (set metrics.peak_flops)")
    return None


def memory_gib(device: torch.device) -> float:
    """Peak memory since the last call: CUDA allocator peak, or the process's peak RSS on CPU."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        return peak / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30


class MetricsLogger:
    """Collects per-step figures and writes them every `log_freq` steps (rank 0 writes files)."""

    def __init__(self, cfg: Metrics, dump_folder: Path, device: torch.device, write_files: bool,
                 flops_per_token: int, tokens_per_step_per_device: float, total_steps: int,
                 start_step: int = 0):
        self.cfg, self.device, self.start_step = cfg, device, start_step
        self.flops_per_token, self.total_steps = flops_per_token, total_steps
        self.tokens_per_step = tokens_per_step_per_device
        self.peak = peak_flops(device, cfg.peak_flops)
        self.jsonl = self.tb = None
        if write_files:
            dump_folder.mkdir(parents=True, exist_ok=True)
            self.jsonl = (dump_folder / "metrics.jsonl").open("a", buffering=1)
            if cfg.enable_tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(log_dir=str(dump_folder / cfg.save_tb_folder))
        self._reset(time.perf_counter())
        self.start = self.window_start

    def _reset(self, now: float) -> None:
        self.window_start, self.window_steps, self.data_time = now, 0, 0.0

    def add_data_time(self, seconds: float) -> None:
        self.data_time += seconds

    def exclude_time(self, seconds: float) -> None:
        """Leave work that is not training (validation) out of this window's throughput."""
        self.window_start += seconds

    def should_log(self, step: int) -> bool:
        first = step == self.start_step + 1
        return first or step % self.cfg.log_freq == 0 or step == self.total_steps

    def count_step(self) -> None:
        self.window_steps += 1

    def log(self, step: int, loss: float, grad_norm: float, lr: float,
            val_loss: float | None = None) -> dict[str, Any]:
        now = time.perf_counter()
        elapsed = max(now - self.window_start, 1e-9)
        tps = self.tokens_per_step * self.window_steps / elapsed
        tflops = self.flops_per_token * tps / 1e12
        record = {
            "step": step, "loss": loss, "grad_norm": grad_norm, "lr": lr, "tps": tps,
            "tflops": tflops, "mfu": None if self.peak is None else 100 * tflops * 1e12 / self.peak,
            "memory_gib": memory_gib(self.device), "data_loading_pct": 100 * self.data_time / elapsed,
            "elapsed_s": now - self.start,
        }
        if val_loss is not None:  # only on the steps that validated
            record["val_loss"] = val_loss
        eta = (now - self.start) / max(1, step - self.start_step) * (self.total_steps - step)
        self._write(record, eta)
        self._reset(now)
        return record

    def _write(self, r: dict[str, Any], eta: float) -> None:
        mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.1f}%"
        color = ("", "") if self.cfg.disable_color_printing else ("\033[32m", "\033[0m")
        logger.info(
            f"{color[0]}step {r['step']:>6}{color[1]}  loss {r['loss']:.4f}  "
            f"grad_norm {r['grad_norm']:.3f}  lr {r['lr']:.2e}  tps {r['tps']:,.0f}  "
            f"tflops {r['tflops']:.2f}  mfu {mfu}  mem {r['memory_gib']:.2f}GiB  "
            f"data {r['data_loading_pct']:.1f}%  eta {time.strftime('%H:%M:%S', time.gmtime(eta))}"
            + (f"  val_loss {r['val_loss']:.4f}" if "val_loss" in r else "")
        )
        if self.jsonl is not None:
            self.jsonl.write(json.dumps(r) + "\n")
        if self.tb is not None:
            for key, value in r.items():
                if key != "step" and value is not None:
                    tag = "validation/loss" if key == "val_loss" else f"train/{key}"
                    self.tb.add_scalar(tag, value, r["step"])

    def close(self) -> None:
        if self.jsonl is not None:
            self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
