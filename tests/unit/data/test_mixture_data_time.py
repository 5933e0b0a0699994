"""A mixture's sources cost the loader nothing per source: the data time per step at the debug
shape with 8 sources is within 10% of 1 source's (scripts/mixture_data_time.py, alternating
rounds in this process, each variant's fastest round)."""

import sys

from helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from mixture_data_time import measure  # noqa: E402


def test_eight_sources_cost_what_one_does(tmp_path):
    # Many short rounds: on the suite's loaded cores the fastest of them is the cost itself.
    result = measure(tmp_path, rounds=20, steps=50)
    assert result["ratio_fastest"] <= 1.10, result
