"""Hugging Face interop through real training runs (torchrun, gloo): a checkpoint imported from
transformers continues training at the loss titanlite's (and transformers') forward gives, on
one process and on FSDP 2 x TP 2, and what each layout saves exports to identical files."""

import filecmp
import json

import pytest
import torch
from helpers import CHECKPOINTED_RUN, losses_by_step, make_hf_llama, train
from helpers import LAYOUTS as ALL_LAYOUTS

from titanlite.components.checkpoint import hf as hf_checkpoint
from titanlite.components.checkpoint.storage import load_full_state_dict, read_manifest
from titanlite.components.loss import cross_entropy_loss
from titanlite.data import Tokenizer, build_dataloader
from titanlite.preflight import checks as preflight

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

LAYOUTS = {name: ALL_LAYOUTS[name] for name in ("one", "fsdp2_tp2")}
# lr 0: the saved weights are the loaded ones exactly, whatever the layout's arithmetic. Causal
# attention with every target counted: the loss transformers' forward gives.
CONTINUE = [
    "--model.attn_mask_type",
    "causal",
    "--model.n_kv_heads",
    "4",
    "--optimizer.lr",
    "0",
    "--training.steps",
    "1",
    "--checkpoint.last_save_model_weights_only",
]


def first_batch_loss(step, hf_folder) -> tuple[float, float]:
    """(titanlite's, transformers') loss on the first batch the trainer reads, 1 process."""
    _, pre = preflight.run([*CHECKPOINTED_RUN, *LAYOUTS["one"][1], *CONTINUE], 1)
    loader = build_dataloader(
        pre.dataset,
        Tokenizer(pre.tokenizer_path),
        seq_len=64,
        local_batch_size=8,
        dp_rank=0,
        dp_size=1,
        seed=0,
    )
    inputs, labels = next(iter(loader))
    from models.llama import Transformer

    model = Transformer(pre.model_args)
    model.load_state_dict(load_full_state_dict(step)["model"])
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(hf_folder, dtype=torch.float32)
    with torch.no_grad():
        return (
            cross_entropy_loss(model(inputs), labels).item(),
            cross_entropy_loss(hf_model(inputs).logits, labels).item(),
        )


@pytest.mark.slow
def test_imported_checkpoint_continues_training_and_every_layout_exports_the_same(tmp_path):
    src = make_hf_llama(tmp_path / "hf", n_kv_heads=4, n_layers=2)  # TINY_RUN's two blocks
    imported = tmp_path / "imported" / "step-0"
    hf_checkpoint.hf_to_dcp(src, imported)
    first, exported = {}, {}
    for name, (nproc, args) in LAYOUTS.items():
        run = tmp_path / name
        proc = train(nproc, run, *args, *CONTINUE, "--checkpoint.initial_load_path", str(imported))
        assert "loaded model from" in proc.stderr
        assert (
            "other hyper-parameters" not in proc.stderr
        )  # the configured model is the imported one
        first[name] = losses_by_step(run)[1]
        step = run / "checkpoint" / "step-1"
        assert read_manifest(step)["world_size"] == nproc
        exported[name] = tmp_path / f"{name}_hf"
        hf_checkpoint.dcp_to_hf(step, exported[name])
    ours, theirs = first_batch_loss(imported, src)
    assert abs(first["one"] - ours) <= 1e-5 * ours, (first, ours)
    assert abs(first["fsdp2_tp2"] - ours) <= 1e-4 * ours, (first, ours)
    assert abs(theirs - ours) <= 1e-5 * ours, (theirs, ours)
    # Saved from 4 ranks' shards or from 1 process: the same files, byte for byte, and the
    # weights transformers wrote in the first place.
    one, sharded = exported["one"], exported["fsdp2_tp2"]
    assert sorted(p.name for p in one.iterdir()) == sorted(p.name for p in sharded.iterdir())
    for f in one.iterdir():
        assert filecmp.cmp(f, sharded / f.name, shallow=False), f.name
    original = safetensors_torch.load_file(src / "model.safetensors")
    again = safetensors_torch.load_file(one / "model.safetensors")
    assert sorted(again) == sorted(original)
    assert all(torch.equal(again[k], original[k]) for k in original)
    assert json.loads((one / "config.json").read_text())["num_key_value_heads"] == 4
