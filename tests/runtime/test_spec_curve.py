"""Throughput curve (runtime/csrc/spec_curve.h): lookup, online correction, profiling, the disk cache."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from dsgraph.runtime.spec_schedule import (
    CurveLookup,
    curve_cache_key,
    curve_path,
    load_curve,
    load_or_profile_curve,
    make_curve,
    profile_curve,
    save_curve,
)

SIZES = (1, 2, 4, 8, 16)
MS = (1.0, 1.2, 1.6, 2.4, 4.0)


def test_step_lookup_costs_the_first_bucket_at_or_above_n() -> None:
    curve = make_curve(SIZES, MS)
    assert [curve.profiled(n) for n in (1, 2, 3, 4, 5, 8, 9, 16)] == [1.0, 1.2, 1.6, 1.6, 2.4, 2.4, 4.0, 4.0]
    assert curve.predict(3) == 1.6 and curve.slope_ms == 0 and curve.largest == 16


def test_linear_lookup_interpolates_and_is_flat_below_the_first_point() -> None:
    curve = make_curve((4, 8, 16), (2.0, 3.0, 7.0), lookup="linear")
    assert curve.lookup == CurveLookup.LINEAR
    assert [curve.profiled(n) for n in (1, 4, 6, 8, 12, 16)] == [2.0, 2.0, 2.5, 3.0, 5.0, 7.0]


@pytest.mark.parametrize(
    ("sizes", "ms", "message"),
    [
        ((), (), r"sizes is empty"),
        ((1, 2), (1.0,), r"step_ms has 1 entries; expected one per size \(2\)"),
        ((0, 2), (1.0, 1.0), r"sizes\[0\] = 0 is not positive"),
        ((2, 2), (1.0, 1.0), r"sizes\[1\] = 2 is not greater than sizes\[0\]"),
        ((1, 2), (1.0, 0.0), r"step_ms\[1\] = 0.0+ is not finite and > 0"),
        ((1, 2), (float("inf"), 1.0), r"step_ms\[0\] = inf is not finite and > 0"),
    ],
)
def test_bad_points_name_the_entry(sizes: tuple[int, ...], ms: tuple[float, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_curve(sizes, ms)


def test_bad_correction_settings_and_queries_are_named() -> None:
    with pytest.raises(ValueError, match=r"CurveCorrection.window = 0 is not positive"):
        make_curve(SIZES, MS, window=0)
    with pytest.raises(ValueError, match=r"CurveCorrection.min_samples = 11 is outside 1..window = 10"):
        make_curve(SIZES, MS, window=10, min_samples=11)
    with pytest.raises(ValueError, match=r"CurveCorrection.min_fraction = 0.0+ is outside \(0, 1\]"):
        make_curve(SIZES, MS, min_fraction=0.0)
    with pytest.raises(ValueError, match=r"lookup: 'cubic' must be one of"):
        make_curve(SIZES, MS, lookup="cubic")  # type: ignore[arg-type]
    curve = make_curve(SIZES, MS)
    with pytest.raises(ValueError, match=r"ThroughputCurve.predict: n = 17 rows is outside 1..largest"):
        curve.predict(17)
    with pytest.raises(ValueError, match=r"ThroughputCurve.observe: n = 0 rows is outside"):
        curve.observe(0, 1.0)
    with pytest.raises(ValueError, match=r"measured_ms = -1.0+ is not finite and >= 0"):
        curve.observe(4, -1.0)


def test_slope_is_the_median_over_buckets_of_median_residuals() -> None:
    # Residual per row: (measured - bucket time) / bucket size, grouped by bucket.
    curve = make_curve((4, 8), (1.0, 2.0), min_samples=2)
    curve.observe(4, 1.4)  # bucket 4: 0.1
    assert curve.slope_ms == 0  # no bucket has min_samples yet
    curve.observe(3, 1.8)  # bucket 4: 0.2
    curve.observe(3, 5.0)  # bucket 4: 1.0 (an outlier); median 0.2
    assert curve.slope_ms == pytest.approx(0.2)
    curve.observe(8, 2.8)  # bucket 8: 0.1
    curve.observe(5, 2.0)  # bucket 8: 0.0; median 0.05
    assert curve.slope_ms == pytest.approx((0.2 + 0.05) / 2)
    assert curve.predict(5) == pytest.approx(2.0 + 0.125 * 8)
    curve.reset()
    assert curve.slope_ms == 0 and curve.num_samples == 0


def synthetic_step(curve_ms: dict[int, float], shift: float, rng: random.Random) -> tuple[int, float]:
    """A step of random n on a device whose time is the profile + shift per row, with noise and 10%
    stalls that take three times as long."""
    n = rng.randint(1, 16)
    bucket = min(b for b in SIZES if b >= n)
    true = curve_ms[bucket] + shift * bucket
    return n, true * (3.0 if rng.random() < 0.1 else rng.uniform(0.98, 1.02))


@pytest.mark.parametrize("shift", [0.05, -0.02])
def test_correction_converges_to_a_shifted_curve(shift: float) -> None:
    curve, rng = make_curve(SIZES, MS, window=2000), random.Random(7)
    profile = dict(zip(SIZES, MS, strict=True))
    for _ in range(3000):
        curve.observe(*synthetic_step(profile, shift, rng))
    assert curve.num_samples == 2000
    for n in range(1, 17):
        bucket = min(b for b in SIZES if b >= n)
        assert curve.predict(n) == pytest.approx(profile[bucket] + shift * bucket, rel=0.03)


def test_bounded_window_follows_a_change_of_device_speed() -> None:
    curve, rng = make_curve(SIZES, MS, window=500), random.Random(3)
    profile = dict(zip(SIZES, MS, strict=True))
    for _ in range(500):
        curve.observe(*synthetic_step(profile, 0.1, rng))
    assert curve.slope_ms == pytest.approx(0.1, abs=0.01)
    for _ in range(500):  # the window now holds only the new regime
        curve.observe(*synthetic_step(profile, 0.0, rng))
    assert curve.slope_ms == pytest.approx(0.0, abs=0.01)


def test_prediction_never_drops_below_the_floor() -> None:
    curve = make_curve(SIZES, MS, min_samples=1, min_fraction=0.25)
    for n in SIZES:
        curve.observe(n, 0.0)  # a device that reports free steps
    # The smallest profiled time per row is 4.0 / 16 = 0.25 ms: the slope stops at -0.75 * 0.25.
    assert curve.slope_ms == pytest.approx(-0.1875) == curve.min_slope_ms
    for n in range(1, 17):
        assert curve.predict(n) >= 0.25 * curve.profiled(n) - 1e-12 > 0


def scripted_run_step(times: dict[int, list[float]], calls: list[int]):  # noqa: ANN201
    def run_step(n: int) -> float:
        calls.append(n)
        return times[n].pop(0)

    return run_step


def test_profile_drops_the_extremes_and_runs_the_largest_first() -> None:
    calls: list[int] = []
    times = {4: [99.0, 2.0, 1.0, 9.0, 3.0, 4.0], 1: [99.0, 1.0, 1.5, 0.5, 2.0, 1.0]}
    curve = profile_curve(scripted_run_step(times, calls), [1, 4], repeats=5)
    assert calls == [4] * 6 + [1] * 6  # one warm-up each
    assert list(curve.sizes) == [1, 4]
    assert list(curve.step_ms) == pytest.approx([(1.0 + 1.5 + 1.0) / 3, (2.0 + 3.0 + 4.0) / 3])


def test_profile_errors_name_the_bucket() -> None:
    with pytest.raises(ValueError, match=r"repeats: 2 must be >= 3"):
        profile_curve(lambda n: 1.0, [1], repeats=2)
    with pytest.raises(ValueError, match=r"run_step\(2\) returned nan; expected a finite time"):
        profile_curve(lambda n: float("nan") if n == 2 else 1.0, [1, 2], repeats=3)
    with pytest.raises(ValueError, match=r"buckets: \[2, 2\] must be distinct positive"):
        profile_curve(lambda n: 1.0, [2, 2], repeats=3)


CONFIG = {"hidden_size": 64, "num_hidden_layers": 6, "vocab_size": 256}


def test_cache_key_changes_with_config_buckets_and_device() -> None:
    key = curve_cache_key(CONFIG, [1, 2, 4], "NVIDIA H200")
    assert len(key) == 64 and int(key, 16) >= 0
    assert curve_cache_key(dict(reversed(CONFIG.items())), [1, 2, 4], "NVIDIA H200") == key
    assert curve_cache_key({**CONFIG, "hidden_size": 128}, [1, 2, 4], "NVIDIA H200") != key
    assert curve_cache_key(CONFIG, [1, 2, 4, 8], "NVIDIA H200") != key
    assert curve_cache_key(CONFIG, [1, 2, 4], "cpu") != key
    # A config given as text is hashed as given (a mapping as its sorted JSON).
    assert curve_cache_key(json.dumps(CONFIG), [1, 2, 4], "NVIDIA H200") == key
    assert curve_cache_key(json.dumps(CONFIG, indent=1), [1, 2, 4], "NVIDIA H200") != key


def test_cache_round_trip(tmp_path: Path) -> None:
    key = curve_cache_key(CONFIG, SIZES, "cpu")
    assert load_curve(tmp_path, key) is None
    curve = make_curve(SIZES, (1.0, 1.25, 1.5, 2.125, 4.0625), lookup="linear")
    path = save_curve(curve, tmp_path / "sub", key, device_name="cpu")
    assert path == curve_path(tmp_path / "sub", key) and path.is_file()
    assert os.listdir(tmp_path / "sub") == [path.name]  # no temporary file left behind
    loaded = load_curve(tmp_path / "sub", key)
    assert loaded is not None
    assert (list(loaded.sizes), list(loaded.step_ms), loaded.lookup) == (
        list(SIZES),
        [1.0, 1.25, 1.5, 2.125, 4.0625],
        CurveLookup.LINEAR,
    )
    assert load_curve(tmp_path / "sub", key, max_age_s=3600) is not None
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "created": record["created"] - 7200}))
    assert load_curve(tmp_path / "sub", key, max_age_s=3600) is None


def test_cache_rejects_a_file_of_another_key_or_a_bad_curve(tmp_path: Path) -> None:
    key, other = curve_cache_key(CONFIG, SIZES, "cpu"), curve_cache_key(CONFIG, SIZES, "gpu")
    path = save_curve(make_curve(SIZES, MS), tmp_path, other)
    os.replace(path, curve_path(tmp_path, key))
    with pytest.raises(ValueError, match=rf"field 'key' is '{other}'; expected '{key}'"):
        load_curve(tmp_path, key)
    record = json.loads(curve_path(tmp_path, key).read_text())
    curve_path(tmp_path, key).write_text(json.dumps({**record, "key": key, "step_ms": [1.0, -2.0, 1, 1, 1]}))
    with pytest.raises(ValueError, match=r"bad curve .*step_ms\[1\] = -2.0+ is not finite and > 0"):
        load_curve(tmp_path, key)
    curve_path(tmp_path, key).write_text("{")
    with pytest.raises(ValueError, match=r"not JSON"):
        load_curve(tmp_path, key)


def test_load_or_profile_profiles_once_per_key(tmp_path: Path) -> None:
    calls: list[int] = []

    def run_step(n: int) -> float:
        calls.append(n)
        return 0.5 + n

    first = load_or_profile_curve(
        run_step, [1, 2], cache_dir=tmp_path, model_config=CONFIG, device_name="cpu"
    )
    assert list(first.step_ms) == [1.5, 2.5] and len(calls) == 2 * 6
    again = load_or_profile_curve(
        run_step, [1, 2], cache_dir=tmp_path, model_config=CONFIG, device_name="cpu"
    )
    assert list(again.step_ms) == [1.5, 2.5] and len(calls) == 2 * 6
    load_or_profile_curve(run_step, [1, 2], cache_dir=tmp_path, model_config=CONFIG, device_name="cuda")
    assert len(calls) == 4 * 6
