"""Which CPUs emulate bfloat16, told from their feature flags (what torch's cpuinfo or Linux's
/proc/cpuinfo list) and oneDNN's instruction-set limit: the detector behind preflight's warning
(the warning itself, through ./run_train.sh: tests/e2e/test_bad_input_pipeline.py)."""

import pytest

from titanlite.config.loader import load
from titanlite.preflight import bf16

# /proc/cpuinfo lines of real processors, shortened to the flags that matter.
CASCADE_LAKE = (
    "flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni"
)
SAPPHIRE_RAPIDS = CASCADE_LAKE + " avx512_bf16 amx_bf16 amx_tile amx_int8"
ZEN3 = "flags\t\t: fpu sse4_2 avx avx2 fma sha_ni"
ZEN4 = ZEN3 + " avx512f avx512bw avx512vl avx512_bf16"
GRAVITON2 = "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp"
GRAVITON3 = GRAVITON2 + " sve i8mm bf16 svebf16"


@pytest.mark.parametrize(
    "cpuinfo, emulated",
    [
        (CASCADE_LAKE, True),
        (SAPPHIRE_RAPIDS, False),
        (ZEN3, True),
        (ZEN4, False),
        (GRAVITON2, True),
        (GRAVITON3, False),
    ],
)
def test_cpus_without_bf16_instructions_emulate_it(cpuinfo, emulated):
    flags = bf16.cpuinfo_flags(f"processor\t: 0\nvendor_id\t: x\n{cpuinfo}\nbogomips\t: 1\n")
    assert flags and bool(bf16.emulated_bf16(flags, {})) == emulated


def test_torch_names_the_same_flags_on_this_machine():
    # torch's own names for this CPU's features (those the detector reads first) include the
    # basic ones /proc/cpuinfo lists too: the sets above speak the same language.
    flags = bf16.cpu_flags()
    assert flags & {"avx2", "avx512_f", "neon", "asimd", "fma3"}, sorted(flags)


def test_onednn_held_below_bf16_emulates_it_even_on_a_cpu_with_it():
    flags = bf16.cpuinfo_flags(SAPPHIRE_RAPIDS)
    for limit in ("AVX2", "avx512_core", "AVX512_CORE_VNNI"):
        assert "ONEDNN_MAX_CPU_ISA=" in bf16.emulated_bf16(flags, {"ONEDNN_MAX_CPU_ISA": limit})
    for limit in ("AVX512_CORE_BF16", "AVX512_CORE_AMX", "ALL", ""):
        assert bf16.emulated_bf16(flags, {"ONEDNN_MAX_CPU_ISA": limit}) == ""
    assert bf16.emulated_bf16(set(), {}) == ""  # flags unknown: no claim


def test_the_warning_is_for_bf16_training_on_cpu_only():
    zen3 = bf16.cpuinfo_flags(ZEN3)
    job = load(["--training.mixed_precision_param", "bfloat16"])
    line = bf16.warning(job, "cpu", zen3, {})
    assert line.startswith("titanlite: warning: training.mixed_precision_param = 'bfloat16'")
    assert "--training.mixed_precision_param float32" in line and "\n" not in line
    assert bf16.warning(job, "cuda", zen3, {}) == ""
    fp32 = load(["--training.mixed_precision_param", "float32"])
    assert bf16.warning(fp32, "cpu", zen3, {}) == ""
