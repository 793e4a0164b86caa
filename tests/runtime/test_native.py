"""dsgraph.runtime._native: version, bucket table, padding, and the generated stub under golden test.

`pytest --update-goldens` rewrites tests/runtime/golden/_native.pyi and runtime/_native.pyi from the
built module (then review the diff).
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsgraph.runtime import _native

REPO = Path(__file__).resolve().parents[2]
GOLDEN_STUB = REPO / "tests" / "runtime" / "golden" / "_native.pyi"
SHIPPED_STUB = REPO / "runtime" / "_native.pyi"
INT32_MAX = 2**31 - 1

# Bucket lists: strictly increasing positive sizes, as the runtime configures them.
bucket_lists = st.lists(st.integers(1, 100_000), min_size=1, max_size=12, unique=True).map(sorted)


def brute_force_choose(sizes: list[int], n: int) -> int | None:
    fitting = [size for size in sizes if size >= n]
    return min(fitting) if n > 0 and fitting else None


def test_version_is_the_package_version() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert _native.version() == pyproject["project"]["version"]
    assert _native.version() == importlib.metadata.version("dsgraph")


def test_sizes_round_trip() -> None:
    assert _native.BucketTable([1, 2, 4, 8, 16]).sizes == [1, 2, 4, 8, 16]
    assert _native.BucketTable([INT32_MAX]).sizes == [INT32_MAX]


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ([], r"sizes is empty"),
        ([0, 1], r"sizes\[0\] = 0 is not positive"),
        ([1, 2, -4], r"sizes\[2\] = -4 is not positive"),
        ([1, 4, 4], r"sizes\[2\] = 4 is not greater than sizes\[1\] = 4"),
        ([8, 2], r"sizes\[1\] = 2 is not greater than sizes\[0\] = 8"),
        ([1, INT32_MAX + 1], r"sizes\[1\] = 2147483648 exceeds the int32 range"),
    ],
)
def test_bad_sizes_name_the_entry(sizes: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _native.BucketTable(sizes)


@pytest.mark.parametrize(("n", "bucket"), [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16), (16, 16)])
def test_choose_examples(n: int, bucket: int) -> None:
    assert _native.BucketTable([1, 2, 4, 8, 16]).choose(n) == bucket


@pytest.mark.parametrize(
    ("n", "message"),
    [
        (17, r"no bucket fits n = 17; the largest bucket is 16"),
        (2**40, r"no bucket fits n = 1099511627776; the largest bucket is 16"),
        (0, r"n = 0 is not positive; expected 1 <= n <= largest bucket 16"),
        (-3, r"n = -3 is not positive"),
    ],
)
def test_choose_errors_name_n_and_largest(n: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _native.BucketTable([1, 2, 4, 8, 16]).choose(n)


@given(sizes=bucket_lists, data=st.data())
def test_choose_is_smallest_fitting_bucket(sizes: list[int], data: st.DataObject) -> None:
    # Half the draws sit on or next to a bucket edge, where off-by-one errors live.
    near_edge = st.builds(lambda size, offset: size + offset, st.sampled_from(sizes), st.integers(-1, 1))
    n = data.draw(st.one_of(near_edge, st.integers(-5, 100_005)), label="n")
    table = _native.BucketTable(sizes)
    expected = brute_force_choose(sizes, n)
    if expected is None:
        with pytest.raises(ValueError, match=f"n = {n}"):
            table.choose(n)
    else:
        assert table.choose(n) == expected


@given(sizes=bucket_lists, data=st.data())
def test_choose_many_equals_choose_elementwise(sizes: list[int], data: st.DataObject) -> None:
    table = _native.BucketTable(sizes)
    counts = data.draw(st.lists(st.integers(1, sizes[-1]), max_size=64))
    chosen = table.choose_many(np.asarray(counts, dtype=np.int32))
    assert chosen.dtype == np.int32
    assert chosen.shape == (len(counts),)
    assert chosen.tolist() == [table.choose(n) for n in counts]


def test_choose_many_result_is_a_new_array() -> None:
    counts = np.array([3, 1], dtype=np.int32)
    chosen = _native.BucketTable([2, 4]).choose_many(counts)
    chosen[0] = 99
    assert counts.tolist() == [3, 1]
    assert _native.BucketTable([2, 4]).choose_many(np.zeros(0, dtype=np.int32)).shape == (0,)


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        ([1, 2, 17, 3], r"entry 2: no bucket fits n = 17; the largest bucket is 16"),
        ([4, 0], r"entry 1: n = 0 is not positive"),
        ([-1], r"entry 0: n = -1 is not positive"),
    ],
)
def test_choose_many_errors_name_the_entry(counts: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _native.BucketTable([1, 2, 4, 8, 16]).choose_many(np.asarray(counts, dtype=np.int32))


@pytest.mark.parametrize(
    "counts",
    [
        np.array([1, 2], dtype=np.int64),  # no silent narrowing copy
        np.arange(8, dtype=np.int32)[::2],  # not contiguous
        np.ones((2, 2), dtype=np.int32),  # not 1-d
        [1, 2],  # not an array
    ],
)
def test_choose_many_rejects_other_arrays(counts: object) -> None:
    with pytest.raises(TypeError, match="choose_many"):
        _native.BucketTable([1, 2, 4]).choose_many(counts)


@pytest.mark.parametrize(("n", "bucket", "padding"), [(0, 8, 8), (3, 8, 5), (8, 8, 0), (1, 1, 0)])
def test_pad_rows(n: int, bucket: int, padding: int) -> None:
    assert _native.pad_rows(n, bucket) == padding


@pytest.mark.parametrize(
    ("n", "bucket", "message"),
    [
        (9, 8, r"n = 9 is outside 0..bucket = 8"),
        (-1, 8, r"n = -1 is outside 0..bucket = 8"),
        (0, 0, r"bucket = 0 is not positive"),
    ],
)
def test_pad_rows_errors(n: int, bucket: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _native.pad_rows(n, bucket)


def generate_stub(out_dir: Path) -> str:
    stub = out_dir / "_native.pyi"
    module = "dsgraph.runtime._native"
    command = [sys.executable, "-m", "nanobind.stubgen", "-q", "-m", module, "-o", str(stub)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"stubgen failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return stub.read_text()


def test_stub_matches_golden(tmp_path: Path, update_goldens: bool) -> None:
    stub = generate_stub(tmp_path)
    if update_goldens:
        GOLDEN_STUB.write_text(stub)
        SHIPPED_STUB.write_text(stub)
        pytest.skip(f"--update-goldens: rewrote {GOLDEN_STUB} and {SHIPPED_STUB}")
    assert stub == GOLDEN_STUB.read_text(), (
        f"stub of the built _native differs from {GOLDEN_STUB}; if the change is intended, "
        "rerun with --update-goldens and review the diff"
    )
    assert SHIPPED_STUB.read_text() == GOLDEN_STUB.read_text(), (
        f"{SHIPPED_STUB} differs from {GOLDEN_STUB}; rerun with --update-goldens"
    )
