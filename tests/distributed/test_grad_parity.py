"""Per-parameter gradient parity: after one forward/backward from the same weights and batch
(8 sequences of 64 tokens, the first two blocks of a family's debug model, fp32), every parameter's full gradient under each layout
is within 1e-4 (relative, in norm) of the single process's, and none is zero or missing where
the single process has one. Catches what a loss or total-norm comparison hides: one lost
gradient (the token embedding's under compile + TP was zero on torch 2.13) barely moves either.

All layouts of one world size run in one process group (grad_parity_worker.py); `pytest -s`
prints each layout's worst parameter.
"""

import json

import pytest
from grad_parity_worker import run
from helpers import spawn

pytest.importorskip("torchao")

RTOL = 1e-4
# Float8 (emulated, tensorwise) is compared with the same float8 model in one process on the same
# data-parallel parts of the batch (each rank scales by the amax of its own part): FSDP and DDP
# then match as fp32 does (RTOL). Tensor parallel does not: its float32 sums in another order
# move values across float8 rounding steps (2 mantissa bits in e5m2). Measured worst and median
# (`pytest -s`, printed per layout): docs/float8.md, whose figures come from this test; float8
# itself is ~0.1 from float32.
FLOAT8_RTOL = 6e-2

FSDP2_TP2 = {"dp_shard": 2, "tp": 2}
AC_OP = {"ac_mode": "selective", "ac_option": "op"}
# Documents that cross the cp chunk borders (grad_parity_worker._batch plants the BOS tokens).
DOCUMENTS = {"attn_mask_type": "block_causal", "bos_id": 1}
TIED = {"tie_word_embeddings": True}
# 8 experts, 2 per token, with the aux loss (weighed as the trainer weighs it); under TP the
# experts are replicated and each rank routes its sequence shard (parallelisms/moe_tp.py).
QWEN3_MOE = {"family": "qwen3", "flavor": "debugmodel_moe"}
DEEPSEEK = {"family": "deepseek_v3", "model": {"mtp_depth": 0}}
WORLD2 = {
    "fsdp2": {"dp_shard": 2},
    "ddp2": {"dp_replicate": 2},
    "tp2": {"tp": 2},
    "tp2_no_loss_parallel": {"tp": 2, "opts": {"loss_parallel": False}},
    "fsdp2_accum2": {"dp_shard": 2, "microbatches": 2},
    "fsdp2_compile": {"dp_shard": 2, "opts": {"compile": True}},
    # Pipeline parallel (torch.distributed.pipelining): a zero-bubble schedule computes the
    # input and weight gradients apart.
    "pp2_1f1b": {"pp": 2},
    "pp2_interleaved1f1b": {"pp": 2, "schedule": "Interleaved1F1B"},
    "pp2_zbv": {"pp": 2, "schedule": "ZBVZeroBubble"},
    # Context parallel: attn_type "auto" runs the per-piece varlen kernel (causal, and
    # block_causal documents), "sdpa" the dense additive mask.
    "cp2": {"cp": 2},
    "cp2_documents": {"cp": 2, "model": DOCUMENTS},
    "cp2_documents_sdpa": {"cp": 2, "model": {**DOCUMENTS, "attn_type": "sdpa"}},
    "cp2_contiguous": {"cp": 2, "load_balancer": "none"},
    "cp2_compile": {"cp": 2, "opts": {"compile": True}},
    "fsdp2_float8": {"dp_shard": 2, "float8": True},
    "ddp2_float8": {"dp_replicate": 2, "float8": True},
    "tp2_float8": {"tp": 2, "float8": True},
    # Qwen3 dense (its debugmodel: per-head q/k norms, head_dim apart from dim), untied and
    # with the head tied to the embedding (one FSDP unit; re-tied after TP). FSDP 2, TP 2, PP 2
    # and tied FSDP 2, dense and MoE, are in test_layout_parity.py, step-1 gradients included.
    "qwen3_tied_tp2": {"family": "qwen3", "tp": 2, "model": TIED},
    "qwen3_cp2_documents": {"family": "qwen3", "cp": 2, "model": DOCUMENTS},
    # DeepSeek-V3 (MLA: values narrower than keys, padded for the varlen kernel; the all-gather
    # carries keys and values side by side), causal and with documents; without MTP, which
    # this worker's loss does not weigh in (test_layout_parity.py's deepseek_cp2 has it).
    "deepseek_cp2": {**DEEPSEEK, "cp": 2},
    "deepseek_cp2_documents": {**DEEPSEEK, "cp": 2, "model": {**DEEPSEEK["model"], **DOCUMENTS}},
    "deepseek_tp2_no_q_latent": {**DEEPSEEK, "tp": 2, "model": {"mtp_depth": 0, "q_lora_rank": 0}},
}
WORLD4 = {
    "fsdp4": {"dp_shard": 4},
    "tp4": {"tp": 4},
    "hsdp2x2": {"dp_replicate": 2, "dp_shard": 2},
    "fsdp2_tp2": FSDP2_TP2,
    "fsdp2_tp2_accum2": {**FSDP2_TP2, "microbatches": 2},
    "fsdp2_tp2_ac_full": {**FSDP2_TP2, "opts": {"ac_mode": "full"}},
    "fsdp2_tp2_ac_op": {**FSDP2_TP2, "opts": AC_OP},
    # No compiled case here: one per parallelism family across this file and
    # test_layout_parity.py (FSDP and CP above; PP, TP, and FSDP x TP under a memory budget and
    # for Qwen3, there, whose step-1 gradients are checked per parameter as here). Compile costs
    # ~15 s per graph on CPU, and under tensor parallel only Inductor's FX graph cache serves.
    "fsdp2_tp2_float8": {**FSDP2_TP2, "float8": True},
    "pp2_fsdp2": {"pp": 2, "dp_shard": 2},
    "pp2_tp2": {"pp": 2, "tp": 2},
    "cp4_documents": {"cp": 4, "model": DOCUMENTS},
    "cp2_fsdp2": {"cp": 2, "dp_shard": 2},
    "cp2_hsdp": {"cp": 2, "dp_replicate": 2},
    "cp2_tp2": {"cp": 2, "tp": 2},
    "cp2_tp2_ac_op": {"cp": 2, "tp": 2, "opts": AC_OP},
    "pp2_cp2": {"pp": 2, "cp": 2},
    "qwen3_tied_fsdp2_tp2": {"family": "qwen3", **FSDP2_TP2, "model": TIED},
    # What Qwen3's parallelize function applies that no other Qwen3 layout runs: HSDP, full
    # activation checkpointing and float8 linears, together.
    "qwen3_hsdp2x2_ac_full_float8": {
        "family": "qwen3",
        "dp_replicate": 2,
        "dp_shard": 2,
        "float8": True,
        "opts": {"ac_mode": "full"},
    },
    "qwen3_moe_fsdp2_tp2": {**QWEN3_MOE, **FSDP2_TP2},
}


def _results(tmp_path_factory, world: int, layouts: dict) -> dict:
    out = tmp_path_factory.mktemp(f"grads{world}") / "results.json"
    spawn(run, world, layouts, str(out))
    results = json.loads(out.read_text())
    for name, r in results.items():
        print(
            f"\n{name:40s} worst gradient error {r.get('worst')} ({r.get('worst_param')}), "
            f"median {r.get('median')}, lost {r.get('lost')}, {r['seconds']} s"
        )
    return results


@pytest.fixture(scope="module")
def world2(tmp_path_factory):
    return _results(tmp_path_factory, 2, WORLD2)


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    return _results(tmp_path_factory, 4, WORLD4)


def _rtol(spec: dict) -> float:
    return FLOAT8_RTOL if spec.get("float8") and spec.get("tp", 1) > 1 else RTOL


def _check(name: str, r: dict, rtol: float, spec: dict) -> None:
    assert "error" not in r, r["error"]
    assert not r["lost"], f"{name}: zero or missing gradients {r['lost']}"
    assert not r["unexpected"], r["unexpected"]
    assert r["worst"] <= rtol, f"{name}: {r['worst_param']} off by {r['worst']:.2e}"
    # What parity cannot see (an uncompiled block, a contiguous cut train the same model): every
    # block compiled when compile is on, and each cp rank held the chunks its balancer gives.
    blocks = {".".join(k.split(".")[:2]) for k in r["errors"] if k.startswith("layers.")}
    if spec.get("opts", {}).get("compile"):
        assert blocks <= set(r["compiled"]) and r["graphs"] > 0, (r["compiled"], r["graphs"])
    else:
        assert not r["compiled"], r["compiled"]
    cp, held = spec.get("cp", 1), {int(k): v for k, v in r["cp_positions"].items()}  # JSON keys
    assert sorted(held) == list(range(cp if cp > 1 else 0))
    for rank, positions in held.items():
        assert positions == _cp_positions(cp, rank, spec.get("load_balancer", "headtail"))
    if name == "cp2":  # written out: rank 0 holds the first and last quarter
        assert held[0] == [*range(16), *range(48, 64)]
    if name == "cp2_contiguous":
        assert held[0] == list(range(32))


def _cp_positions(cp: int, rank: int, balancer: str, seq: int = 64) -> list[int]:
    if balancer == "none":
        return list(range(rank * seq // cp, (rank + 1) * seq // cp))
    chunk, tail = seq // (2 * cp), 2 * cp - 1 - rank
    return [*range(rank * chunk, (rank + 1) * chunk), *range(tail * chunk, (tail + 1) * chunk)]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(WORLD2))
def test_two_rank_layout_gradients(world2, name):
    _check(name, world2[name], _rtol(WORLD2[name]), WORLD2[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(WORLD4))
def test_four_rank_layout_gradients(world4, name):
    _check(name, world4[name], _rtol(WORLD4[name]), WORLD4[name])
