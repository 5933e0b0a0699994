"""Pipeline parallel without processes: how layers split into stages, which stages a rank holds,
what preflight refuses, and that the stages, run one after another, are the whole model."""

import pytest
import torch

from models.llama import LlamaArgs, Transformer
from parallelisms import LayoutError
from parallelisms.pipeline import (
    ModelParts,
    PipelineOptions,
    check_pipeline,
    num_stages,
    split_layers,
    stage_ids,
    stage_models,
)


@pytest.mark.parametrize(
    "n_layers, stages, first, last, sizes",
    [
        (6, 2, 1, 1, [3, 3]),
        (6, 4, 1, 1, [1, 2, 2, 1]),
        (8, 3, 1, 1, [2, 4, 2]),  # 10 = 3 + 4 + 3: the middle stage takes the spare weight first
        (32, 8, 1, 1, [3, 5, 5, 4, 4, 4, 4, 3]),
        (6, 4, 0, 0, [1, 2, 2, 1]),
        (6, 1, 1, 1, [6]),
        (2, 4, 1, 1, [0, 1, 1, 0]),  # first and last stages: embedding / output only
    ],
)
def test_layers_split_into_contiguous_stages(n_layers, stages, first, last, sizes):
    split = split_layers(n_layers, stages, first, last)
    assert [i for s in split for i in s] == list(range(n_layers))
    if sizes is not None:
        assert [len(s) for s in split] == sizes
    weights = [len(s) for s in split]
    weights[0] += first
    weights[-1] += last
    assert max(weights) - min(weights) <= 1  # embedding and output count as layers


def test_a_split_that_leaves_a_stage_without_work_is_refused():
    with pytest.raises(LayoutError, match="do not split into 4 pipeline stages"):
        split_layers(1, 4, 1, 1)
    with pytest.raises(LayoutError, match="do not split into 4 pipeline stages"):
        split_layers(1, 4, 0, 0)  # a middle stage would hold nothing


def test_stages_per_rank_follow_the_schedule():
    assert stage_ids(1, 2, 2, "1F1B") == [1]
    assert stage_ids(0, 2, 4, "Interleaved1F1B") == [0, 2]
    assert stage_ids(1, 4, 8, "LoopedBFS") == [1, 5]
    assert stage_ids(0, 2, 4, "ZBVZeroBubble") == [0, 3]
    assert stage_ids(1, 2, 4, "ZBVZeroBubble") == [1, 2]
    assert num_stages(2, 6, PipelineOptions("1F1B")) == 2
    assert num_stages(2, 6, PipelineOptions("Interleaved1F1B")) == 4
    assert num_stages(2, 6, PipelineOptions("Interleaved1F1B", layers_per_stage=1)) == 8


@pytest.mark.parametrize(
    "pp, n_layers, batch, opts, words",
    [
        (2, 6, 8, PipelineOptions("2F2B"), "is not a schedule of torch.distributed.pipelining"),
        (2, 6, 8, PipelineOptions(microbatch_size=3), "not divisible by pipeline_parallel_micro"),
        (4, 6, 2, PipelineOptions("1F1B"), "needs at least as many micro-batches as stages"),
        (2, 6, 5, PipelineOptions("Interleaved1F1B"), "multiple of its rounds"),
        (2, 6, 8, PipelineOptions("ZBVZeroBubble", layers_per_stage=1), "exactly 2 stages"),
        (2, 6, 8, PipelineOptions("1F1B", layers_per_stage=2), "runs one stage per rank"),
        (3, 6, 8, PipelineOptions("Interleaved1F1B", layers_per_stage=2), "spread evenly"),
        (4, 2, 8, PipelineOptions("Interleaved1F1B"), "do not split"),
    ],
)
def test_impossible_pipelines_are_refused_before_launch(pp, n_layers, batch, opts, words):
    with pytest.raises(LayoutError, match=words):
        check_pipeline(pp, n_layers, batch, opts)


@pytest.mark.parametrize("mask", ["causal", "block_causal"])
def test_stages_in_sequence_are_the_whole_model(mask):
    args = LlamaArgs(
        dim=64, n_layers=4, n_heads=4, vocab_size=40, max_seq_len=16, bos_id=1, attn_mask_type=mask
    )
    whole = Transformer(args)
    whole.init_weights(seed=3)
    with torch.device("meta"):
        meta = Transformer(args)
    parts = stage_models(meta, split_layers(4, 3, 1, 1), [0, 1, 2])
    for part in parts:
        part.to_empty(device="cpu")
        part.init_weights(seed=3)  # the layout-invariant init: the same values by name
    merged = ModelParts(parts)
    assert dict(merged.named_parameters()).keys() == dict(whole.named_parameters()).keys()
    for name, p in merged.named_parameters():
        assert torch.equal(p, whole.get_parameter(name)), name
    tokens = torch.randint(2, 40, (2, 16))
    tokens[:, [0, 7]] = 1  # two documents per row
    h = parts[0](tokens)
    h = parts[1](h, tokens=tokens)
    torch.testing.assert_close(parts[2](h, tokens=tokens), whole(tokens), rtol=0, atol=0)
