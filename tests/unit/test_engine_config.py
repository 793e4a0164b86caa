"""EngineConfig is one typed tree: every field validated in its sub-config with an error naming the path,
the value and what is allowed; the flat option names (LLM keyword arguments, CLI flags) map onto it and
back in one table; the derived configs take the tree's values (the scheduler pages as the engine does)."""

from __future__ import annotations

import dataclasses

import pytest

from dsgraph.runtime import engine_config as ec
from dsgraph.runtime.engine_config import FLAT, ConfigError, CudaConfig, EngineConfig
from dsgraph.tools.cli import build_parser
from dsgraph.tools.engine_args import engine_kwargs

# a value of every option that differs from its default (and is valid)
CHANGED = {
    "platform": "cuda",
    "numerics": "reference",
    "max_model_len": 64,
    "engine_type": "prompt",
    "bundle": "/some/bundle",
    "max_num_seqs": 3,
    "max_num_batched_tokens": 48,
    "overlap": "off",
    "page_size": 32,
    "cache_budget_bytes": 1 << 20,
    "enable_prefix_cache": False,
    "prefix_replay": "window",
    "speculative": "off",
    "verify_schedule": "fixed",
    "draft_len": 2,
    "deterministic": True,
    "throughput_curve": ((1, 8), (1.0, 2.0)),
    "draft_pause": False,
    "draft_cost": ((1, 2), (0.5, 0.7)),
    "draft_cost_greedy": ((1, 2), (0.2, 0.3)),
    "prefill_truncation": "compact",
    "prefill_keep_tokens": 140,
    "load_format": "dummy",
    "check_weights": True,
    "capture": False,
    "capture_max_tokens": 64,
    "engram_host_min_bytes": 0,
    "side_stream": False,
}


def _leaves() -> list[tuple[str | None, str]]:
    top = [(None, f.name) for f in dataclasses.fields(EngineConfig) if f.name not in ec.SUBCONFIGS]
    subs = [(s, f.name) for s, kind in ec.SUBCONFIGS.items() for f in dataclasses.fields(kind)]
    return top + subs


def test_every_field_has_one_flat_option_and_the_table_is_checked_here() -> None:
    assert sorted(FLAT.values(), key=str) == sorted(_leaves(), key=str)  # one option per leaf, no two alike
    assert set(CHANGED) == set(FLAT)
    defaults = EngineConfig().flat()
    assert all(CHANGED[k] != defaults[k] for k in FLAT), "CHANGED must change every option"


def test_from_flat_places_every_option_and_flat_inverts_it() -> None:
    config = EngineConfig.from_flat(**CHANGED)
    for option, (sub, name) in FLAT.items():
        assert getattr(config if sub is None else getattr(config, sub), name) == CHANGED[option], option
    assert config.flat() == CHANGED
    assert EngineConfig.from_flat(**config.flat()) == config
    assert EngineConfig.from_flat() == EngineConfig()
    assert config.with_flat(max_num_seqs=5).scheduler == dataclasses.replace(config.scheduler, max_num_seqs=5)


def test_sub_configs_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        EngineConfig().scheduler.max_num_seqs = 2  # type: ignore[misc]


BAD = [
    (
        ec.SchedulingConfig,
        {"max_num_seqs": 0},
        "EngineConfig.scheduler.max_num_seqs = 0: expected an integer >= 1",
    ),
    (
        ec.SchedulingConfig,
        {"max_num_batched_tokens": 2.5},
        "max_num_batched_tokens = 2.5: expected an integer",
    ),
    (
        ec.SchedulingConfig,
        {"overlap": "yes"},
        "scheduler.overlap = 'yes': expected one of 'auto', 'on', 'off'",
    ),
    (ec.CacheConfig, {"page_size": True}, "EngineConfig.cache.page_size = True: expected an integer >= 1"),
    (ec.CacheConfig, {"budget_bytes": 0}, "cache.budget_bytes = 0: expected None or an integer >= 1"),
    (ec.CacheConfig, {"enable_prefix_cache": 1}, "cache.enable_prefix_cache = 1: expected a bool"),
    (
        ec.CacheConfig,
        {"prefix_replay": "all"},
        "cache.prefix_replay = 'all': expected one of 'exact', 'window'",
    ),
    (ec.SpeculativeConfig, {"mode": "eagle"}, "speculative.mode = 'eagle': expected one of 'auto', 'dspark'"),
    (ec.SpeculativeConfig, {"verify_schedule": "x"}, "verify_schedule = 'x': expected one of 'confidence'"),
    (
        ec.SpeculativeConfig,
        {"draft_len": -1},
        "EngineConfig.speculative.draft_len = -1: expected None or an integer in 0..5",
    ),
    (ec.SpeculativeConfig, {"draft_len": 6}, "draft_len = 6: expected None or an integer in 0..5"),
    (ec.SpeculativeConfig, {"deterministic": "yes"}, "speculative.deterministic = 'yes': expected a bool"),
    (ec.SpeculativeConfig, {"throughput_curve": ((1, 2), (1.0,))}, "equal, non-zero length"),
    (ec.SpeculativeConfig, {"throughput_curve": ((2, 1), (1.0, 1.0))}, "strictly increasing sizes"),
    (
        ec.SpeculativeConfig,
        {"draft_cost": ((0,), (1.0,))},
        "draft_cost = ((0,), (1.0,)): expected sequence counts",
    ),
    (ec.SpeculativeConfig, {"draft_cost": ((1,), (-1.0,))}, r"expected finite draft ms >= 0"),
    (ec.TruncationConfig, {"mode": "on"}, "EngineConfig.truncation.mode = 'on': expected one of 'off'"),
    (ec.TruncationConfig, {"keep_tokens": 0}, "truncation.keep_tokens = 0: expected None or an integer >= 1"),
    (
        ec.LoadConfig,
        {"format": "random"},
        "EngineConfig.load.format = 'random': expected one of 'auto', 'dummy'",
    ),
    (ec.LoadConfig, {"check_weights": "no"}, "load.check_weights = 'no': expected None or a bool"),
    (CudaConfig, {"capture": None}, "EngineConfig.cuda.capture = None: expected a bool"),
    (CudaConfig, {"capture_max_tokens": 0}, "cuda.capture_max_tokens = 0: expected an integer >= 1"),
    (
        CudaConfig,
        {"engram_host_min_bytes": -1},
        "engram_host_min_bytes = -1: expected None or an integer >= 0",
    ),
    (CudaConfig, {"side_stream": 0}, "EngineConfig.cuda.side_stream = 0: expected None or a bool"),
    (EngineConfig, {"platform": "tpu"}, "EngineConfig.platform = 'tpu': expected one of 'cpu', 'cuda'"),
    (EngineConfig, {"numerics": "fp64"}, "EngineConfig.numerics = 'fp64': expected one of 'serving'"),
    (EngineConfig, {"max_model_len": 0}, "EngineConfig.max_model_len = 0: expected an integer >= 1"),
    (EngineConfig, {"engine_type": "both"}, "EngineConfig.engine_type = 'both': expected one of 'normal'"),
    (EngineConfig, {"bundle": 3}, "EngineConfig.bundle = 3: expected None or a path"),
    (
        EngineConfig,
        {"scheduler": {"max_num_seqs": 2}},
        "EngineConfig.scheduler = {'max_num_seqs': 2}: expected a",
    ),
]


@pytest.mark.parametrize(
    ("kind", "kwargs", "message"), BAD, ids=[f"{k.__name__}-{next(iter(a))}" for k, a, _ in BAD]
)
def test_a_bad_value_names_its_path_value_and_range(kind: type, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        kind(**kwargs)
    assert message in str(caught.value)
    assert caught.value.value == next(iter(kwargs.values()))


def test_flat_options_add_their_name_where_it_differs_from_the_field() -> None:
    with pytest.raises(
        ValueError, match=r"^EngineConfig.speculative.mode = 'x' \(option speculative\): expected"
    ):
        EngineConfig.from_flat(speculative="x")
    with pytest.raises(
        ValueError, match=r"^EngineConfig.cache.budget_bytes = -5 \(option cache_budget_bytes\)"
    ):
        EngineConfig.from_flat(cache_budget_bytes=-5)
    with pytest.raises(
        ValueError, match=r"^EngineConfig.scheduler.max_num_seqs = 0: expected an integer >= 1$"
    ):
        EngineConfig.from_flat(max_num_seqs=0)
    with pytest.raises(TypeError, match=r"unknown options \['max_num_seq'\]"):
        EngineConfig.from_flat(max_num_seq=4)


@pytest.mark.parametrize(
    "options",
    [
        {"engine_type": "prompt", "speculative": "dspark"},
        {"engine_type": "completion", "speculative": "dspark"},
        {"engine_type": "prompt", "speculative": "mtp"},
        {"engine_type": "completion", "overlap": "on"},
    ],
)
def test_disaggregated_engines_refuse_drafting_and_completion_refuses_overlap(options: dict) -> None:
    with pytest.raises(
        ValueError, match=r"^EngineConfig.engine_type = '(prompt|completion)': expected 'normal'"
    ):
        EngineConfig.from_flat(**options)
    assert EngineConfig.from_flat(engine_type="prompt", overlap="on").scheduler.overlap == "on"


@pytest.mark.parametrize("command", ["generate", "serve", "compile"])
def test_cli_defaults_are_the_config_defaults(command: str) -> None:
    extra = ["--out", "x"] if command == "compile" else []
    assert (
        EngineConfig.from_flat(**engine_kwargs(build_parser().parse_args([command, *extra])))
        == EngineConfig()
    )


def test_every_engine_flag_is_an_option() -> None:
    """engine_kwargs keeps the flags named like options: a flag with another name would be dropped."""
    from dsgraph.tools import engine_args

    options = engine_kwargs(build_parser().parse_args(["generate"]))
    assert set(options) == set(engine_args._FLAGS) | {"deterministic"}
    assert set(options) <= set(FLAT)


def test_cli_cuda_flags_reach_the_cuda_sub_config() -> None:
    args = build_parser().parse_args(
        ["serve", "--no-capture", "--capture-max-tokens", "64", "--no-check-weights"]
    )
    config = EngineConfig.from_flat(**engine_kwargs(args))
    assert config.cuda == CudaConfig(capture=False, capture_max_tokens=64)
    assert config.load.check_weights is False


def test_the_scheduler_pages_with_the_engine_configs_page_size() -> None:
    """The page-size default lives in ec.CacheConfig alone: a SchedulerConfig built without an engine takes
    it, and the engine's scheduler (derived from the tree) gets the tree's value."""
    from dsgraph.runtime.checkpoint_load import build_target, cache_sizes, load_model_dir
    from dsgraph.runtime.derived_configs import scheduler_config
    from dsgraph.runtime.scheduler import Scheduler, SchedulerConfig
    from dsgraph.tools.generate_cmd import default_model_dir

    d = SchedulerConfig()
    assert (d.page_size, d.max_model_len) == (ec.CacheConfig().page_size, EngineConfig().max_model_len)
    limits = ec.SchedulingConfig()
    assert (d.max_num_seqs, d.max_num_batched_tokens) == (limits.max_num_seqs, limits.max_num_batched_tokens)
    config = EngineConfig.from_flat(max_model_len=64, page_size=32, max_num_seqs=3, enable_prefix_cache=False)
    model = build_target(load_model_dir(default_model_dir(), config), config)
    derived = scheduler_config(config, model, cache_sizes(model, config), {})
    assert (derived.page_size, derived.max_model_len, derived.max_num_seqs) == (32, 64, 3)
    assert derived.enable_prefix_cache is False and derived.num_slots == 3
    native = Scheduler(derived).native.config
    assert (native.page_size, native.max_model_len, native.max_num_seqs) == (32, 64, 3)


def test_the_session_takes_the_cuda_sub_config() -> None:
    from dsgraph.runtime.session import Session

    cuda = CudaConfig(capture=False, capture_max_tokens=32, side_stream=False)
    session = Session.from_checkpoint(None, EngineConfig(max_model_len=64, cuda=cuda))
    assert session.cuda == cuda and (session.capture, session.capture_max_tokens) == (False, 32)
