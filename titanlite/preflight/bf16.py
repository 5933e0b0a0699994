"""bfloat16 on a CPU that has no bfloat16 instructions: torch (oneDNN) emulates it, and training
runs several times slower than in float32. Measured on the debug model's shape (forward and
backward, one thread, AMD EPYC with AVX512-BF16), with oneDNN held to an older instruction set
by ONEDNN_MAX_CPU_ISA: float32 0.74-0.95 s a step in every case, bfloat16 1.1-1.6 s natively,
1.7 s with AVX-512 but no BF16 (2.3x float32), 9.3-12.0 s with AVX2 only (10-13x).

Preflight says so in one warning line; the run goes on.
"""

from __future__ import annotations

from collections.abc import Collection

from titanlite.config.schema import JobConfig

# x86: AVX512-BF16 and AMX-BF16 (torch and Linux's /proc/cpuinfo spell them alike); arm64: the
# BF16 extension (torch: bf16 / sve_bf16; /proc/cpuinfo: bf16 / svebf16).
NATIVE_BF16 = frozenset({"avx512_bf16", "amx_bf16", "bf16", "sve_bf16", "svebf16"})
# oneDNN's instruction-set limits below its first with bfloat16 arithmetic (AVX512_CORE_BF16).
_ONEDNN_WITHOUT_BF16 = frozenset(
    {"sse41", "avx", "avx2", "avx2_vnni", "avx512_core", "avx512_core_vnni"}
)


def cpuinfo_flags(text: str) -> set[str]:
    """The feature flags of /proc/cpuinfo's first processor (x86 "flags", arm64 "Features")."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_flags() -> set[str]:
    """This CPU's features as torch detects them (cpuinfo, on every OS), else from
    /proc/cpuinfo (torch before get_capabilities); empty when neither can tell."""
    import torch

    capabilities = getattr(torch.cpu, "get_capabilities", None)
    if capabilities is not None:
        return {name for name, value in capabilities().items() if value is True}
    try:
        with open("/proc/cpuinfo") as f:
            return cpuinfo_flags(f.read())
    except OSError:
        return set()


def emulated_bf16(flags: Collection[str], environ: dict[str, str]) -> str:
    """Why bfloat16 would be emulated on this CPU ("" when it would not, or cannot be told)."""
    limit = environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA") or ""
    if limit.lower() in _ONEDNN_WITHOUT_BF16:
        return f"ONEDNN_MAX_CPU_ISA={limit} keeps oneDNN from its bfloat16 instructions"
    if flags and not NATIVE_BF16 & set(flags):
        return "this CPU has neither AVX512-BF16 nor AMX-BF16 (nor arm64 BF16)"
    return ""


def warning(
    job: JobConfig, device_type: str, flags: Collection[str], environ: dict[str, str]
) -> str:
    """The one warning line for a run that would train in emulated bfloat16, else ""."""
    if device_type != "cpu" or job.training.mixed_precision_param != "bfloat16":
        return ""
    why = emulated_bf16(flags, environ)
    if not why:
        return ""
    return (
        f"titanlite: warning: training.mixed_precision_param = 'bfloat16' is emulated on this "
        f"CPU ({why}): about 2x slower than float32 with AVX-512, 10x with AVX2 only; pass "
        "--training.mixed_precision_param float32"
    )
