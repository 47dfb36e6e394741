"""CUDA_VISIBLE_DEVICES -> NVML devices, following CUDA's own rules.

The inventory is the one test double, ``RecordedBackend`` (gpu_recorded.py): a recorded
device model whose GPUs/MIG slots carry the UUIDs below.
"""

from __future__ import annotations

import pytest

from llmtrace.gpu.devices import parse_cuda_visible_devices, resolve_devices
from tests.gpu.gpu_recorded import RecordedBackend, inventory

UUIDS = [
    "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6",
    "GPU-8932a111-0000-4106-c12f-20bd9faed9f6",
    "GPU-1b2c3d4e-0000-4000-8000-000000000002",
    "GPU-77aa0000-0000-4000-8000-000000000003",
]
MIG = {
    3: [
        ("MIG-c3ed6a3c-6c49-5a6d-a4ad-4a41b4ef4bd6", 1, 0),
        ("MIG-d0000000-6c49-5a6d-a4ad-000000000001", 2, 0),
    ]
}


def _ids(visible: str | None, selection: object = "visible") -> list[str]:
    backend = RecordedBackend(inventory(UUIDS, MIG))
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    return [d.device_id for d in resolve_devices(backend, selection, env)]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, ["0", "1", "2", "3"]),  # unset: every GPU in NVML order
        ("2,0", ["2", "0"]),  # ordinals follow the list order
        (" 1 , 3 ", ["1", "3"]),  # whitespace tolerated
        ("1gpu,2", ["1", "2"]),  # strtoul: leading digits count
        ("0,7,1", ["0"]),  # out of range ends the list
        ("1,-1,2", ["1"]),  # a negative index ends the list
        ("0,1,0", []),  # a repeated device hides everything
        ("", []),  # empty: no device
        ("NoDevFiles", []),
        ("-1", []),
    ],
)
def test_indices(visible: str | None, expected: list[str]) -> None:
    """Integer entries map to physical GPUs the way CUDA maps them."""
    assert expected == _ids(visible)


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("GPU-1b2c3d4e-0000-4000-8000-000000000002", ["2"]),  # full UUID
        ("GPU-1b2c,GPU-77aa", ["2", "3"]),  # unique prefixes
        ("GPU-8932f", ["0"]),  # unique once long enough
        ("GPU-8932,GPU-1b2c", []),  # ambiguous prefix is invalid: the list ends before it
        ("GPU-1b2c,GPU-ffff,GPU-77aa", ["2"]),  # unknown UUID ends the list
        ("GPU-1b2c,GPU-1b2c3d", []),  # same device twice
        ("gpu-77aa", ["3"]),  # case-insensitive
        ("2,GPU-77aa", ["2", "3"]),  # CUDA accepts a mix of ordinals and UUIDs
    ],
)
def test_gpu_uuids(visible: str, expected: list[str]) -> None:
    """GPU-<uuid> entries match by unique prefix, as CUDA documents."""
    assert expected == _ids(visible)


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("MIG-c3ed6a3c-6c49-5a6d-a4ad-4a41b4ef4bd6", ["3:mig0"]),  # R470+ MIG UUID
        ("MIG-d000", ["3:mig1"]),  # MIG prefix
        ("MIG-GPU-77aa0000-0000-4000-8000-000000000003/2/0", ["3:mig1"]),  # legacy gi/ci form
        ("MIG-GPU-77aa0000-0000-4000-8000-000000000003/9/0", []),  # no such instance
        ("MIG-ffff", []),
    ],
)
def test_mig_uuids(visible: str, expected: list[str]) -> None:
    """MIG-<uuid> and MIG-GPU-<uuid>/<gi>/<ci> resolve to the MIG instance's handle."""
    assert expected == _ids(visible)


def test_mig_devices_are_flagged_and_keep_cuda_ordinals() -> None:
    """A MIG instance is sampled through its own handle and is cuda:0 in this process."""
    backend = RecordedBackend(inventory(UUIDS, MIG))
    (dev,) = resolve_devices(backend, "visible", {"CUDA_VISIBLE_DEVICES": "MIG-c3ed"})
    assert (dev.visible_index, dev.nvml_index, dev.is_mig, dev.handle) == (0, 3, True, ("mig", 3, 0))
    assert "NVIDIA H200" == dev.name


def test_selection_all_ignores_cuda_visible_devices() -> None:
    """devices='all' samples every GPU of the machine."""
    assert ["0", "1", "2", "3"] == _ids("1", "all")


def test_selection_by_ordinal_and_uuid_prefix_picks_from_visible_devices() -> None:
    """An explicit selection is taken from what this process sees."""
    assert ["3"] == _ids("2,3", [1])
    assert ["2"] == _ids("2,3", ["GPU-1b2c"])
    assert [] == _ids("2", [1])


def test_parse_keeps_uuid_strings_and_stops_at_negative() -> None:
    """The raw parse: ordinals as int, UUID entries as str, None when unset."""
    assert parse_cuda_visible_devices(None) is None
    assert [0, "GPU-ab", 2] == parse_cuda_visible_devices("0,GPU-ab,2,-1,3")
