"""Integer weights in a Hugging Face folder are refused by both entry points that read one, in
one line, before anything is written: `scripts/convert_checkpoint.py hf-to-dcp` and
`./run_train.sh` with `checkpoint.initial_load_in_hf` (refused in preflight, before torchrun).
More cases, in process: tests/unit/components/checkpoint/test_hf.py."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from helpers import TWO_BLOCKS, expect_one_line, run_python, run_train

from models.qwen3 import FLAVORS, HF
from titanlite.data.tokenizer import BUILTIN_TOKENIZER, Tokenizer

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

Q_NORM = "model.layers.0.self_attn.q_norm.weight"


def _int_q_norm_qwen3(folder):
    """The configured qwen3 debug model (two blocks), as transformers writes it, but for an
    int32 q_norm."""
    args = FLAVORS["debugmodel"].with_overrides(
        vocab_size=Tokenizer(BUILTIN_TOKENIZER).vocab_size, n_layers=2
    )
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(**HF.hf_config(args, dtype=torch.float32))
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(folder)
    tensors = safetensors_torch.load_file(folder / "model.safetensors")
    tensors[Q_NORM] = tensors[Q_NORM].to(torch.int32)
    safetensors_torch.save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_int32_weights_stop_the_converter_and_the_run_in_one_line(tmp_path):
    src = _int_q_norm_qwen3(tmp_path / "hf")
    dump = tmp_path / "run"
    train = [
        *TWO_BLOCKS,
        "--model.name",
        "qwen3",
        "--job.dump_folder",
        str(dump),
        "--checkpoint.enable_checkpoint",
        "--checkpoint.initial_load_in_hf",
        "--checkpoint.initial_load_path",
        str(src),
    ]
    convert = ["scripts/convert_checkpoint.py", "hf-to-dcp", str(src), str(tmp_path / "dcp")]
    with ThreadPoolExecutor(2) as pool:
        converted = pool.submit(run_python, convert)
        trained = pool.submit(run_train, train)
    found = (f"tensor {Q_NORM} has dtype int32", "needs floating weights (float32)")
    expect_one_line(converted.result(), 2, "convert_checkpoint: error:", *found)
    expect_one_line(trained.result(), 2, "titanlite: error:", *found)
    assert not (tmp_path / "dcp").exists() and not (tmp_path / ".dcp.partial").exists()
    written = [f for f in dump.rglob("*") if f.is_file() and f.name != ".run.lock"]
    assert not written, written
