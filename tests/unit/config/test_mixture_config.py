"""The data mixture's config: [[data.sources]] and [[data.phases]] read into records, the
command line's per-source override, the round trip through the run's config.toml, and each
mistake as one line; the same for the named held-out sets, [[validation.sources]]."""

import pytest

from titanlite.config import loader as config
from titanlite.config.loader import ConfigError

MIXTURE = """
[training]
steps = 10000
[data]
weight_unit = "tokens"
[[data.sources]]
name = "web"
path = "/data/web"
weight = 0.7
max_repetition = 1.0
[[data.sources]]
name = "code"
path = "/data/code"
weight = 0.3
[[data.phases]]
start_step = 9000
weights = { web = 0.5, code = 0.5 }
"""


def _load(tmp_path, text: str, *argv: str):
    path = tmp_path / "mix.toml"
    path.write_text(text)
    return config.load(["--config", str(path), *argv])


def test_the_issues_schema_loads_and_the_cli_overrides_one_weight(tmp_path):
    cfg = _load(tmp_path, MIXTURE, "--data.sources.code.weight", "0.4")
    assert [(s.name, s.path, s.weight, s.max_repetition) for s in cfg.data.sources] == [
        ("web", "/data/web", 0.7, 1.0),
        ("code", "/data/code", 0.4, 1.0),
    ]
    [phase] = cfg.data.phases
    assert phase.start_step == 9000 and phase.weights == {"web": 0.5, "code": 0.5}
    again = _load(tmp_path, config.to_toml(cfg))  # the run's config.toml loads back the same
    assert again.data == cfg.data


@pytest.mark.parametrize(
    "change, argv, message",
    [
        (("weight = 0.3", "weight = -1.0"), [], "weight = -1.0: must be >= 0.0"),
        (("weight = 0.3", "weight = nan"), [], "weight = nan: expected a finite number"),
        (("weight = 0.3", "weight = inf"), [], "weight = inf: expected a finite number"),
        (
            ("weight = 0.7", "weight = 0.0"),
            ["--data.sources.code.weight", "0"],
            "every weight is 0",
        ),
        (('name = "code"', 'name = "web"'), [], "two sources are named 'web'"),
        (('path = "/data/code"', 'path = ""'), [], "'code' has no path"),
        (("start_step = 9000", "start_step = 20000"), [], "is past training.steps = 10000"),
        (("start_step = 9000", "start_step = 1"), [], "phases must start after step 1"),
        (("code = 0.5 }", "cod = 0.5 }"), [], "weights name 'cod', which is no source"),
        (("max_repetition", "max_repeats"), [], "unknown key 'max_repeats'"),
        (
            ("", ""),
            ["--data.sources.cod.weight", "1"],
            "no source named 'cod' (sources: web, code)",
        ),
        (("", ""), ["--training.dataset_path", "/x"], "training.dataset_path and [[data.sources]]"),
    ],
)
def test_each_mistake_is_one_line(tmp_path, change, argv, message):
    with pytest.raises(ConfigError, match=None) as error:
        _load(tmp_path, MIXTURE.replace(*change, 1) if change[0] else MIXTURE, *argv)
    assert message in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_phases_out_of_order_are_refused(tmp_path):
    text = MIXTURE + "[[data.phases]]\nstart_step = 5000\nweights = { web = 1.0 }\n"
    with pytest.raises(ConfigError, match="increasing order"):
        _load(tmp_path, text)


VALIDATION = """
[validation]
enabled = true
[[validation.sources]]
name = "web"
path = "/held_out/web"
[[validation.sources]]
name = "code"
path = "/held_out/code"
"""


def test_named_validation_sets_load_round_trip_and_take_a_cli_path(tmp_path):
    cfg = _load(tmp_path, VALIDATION, "--validation.sources.code.path", "/elsewhere")
    assert [(s.name, s.path) for s in cfg.validation.sources] == [
        ("web", "/held_out/web"),
        ("code", "/elsewhere"),
    ]
    again = _load(tmp_path, config.to_toml(cfg))
    assert again.validation == cfg.validation


@pytest.mark.parametrize(
    "text, argv, message",
    [
        (VALIDATION, ["--validation.dataset_path", "/x"], "validation.dataset_path and [["),
        (VALIDATION.replace('"code"', '"web"'), [], "two sources are named 'web'"),
        (VALIDATION.replace('path = "/held_out/code"', ""), [], "'code' has no path"),
        (VALIDATION, ["--validation.sources.nope.path", "/x"], "no source named 'nope'"),
        ("[validation]\nenabled = true\n", [], "or [[validation.sources]]"),
    ],
)
def test_each_validation_set_mistake_is_one_line(tmp_path, text, argv, message):
    with pytest.raises(ConfigError, match=None) as e:
        _load(tmp_path, text, *argv)
    assert message in str(e.value) and "\n" not in str(e.value)
