"""GPU types: the specs, unknown names in one line, and NVML device names to types."""

from __future__ import annotations

import pytest

from scheduler_core.gpu_specs import (
    GIB,
    GPU_SPECS,
    MIB,
    UnknownGpuDevice,
    UnknownGpuType,
    get_spec,
    type_for_device_name,
)


def test_the_types_and_their_published_figures() -> None:
    assert sorted(GPU_SPECS) == ["a10", "a100", "h100", "h200", "k80", "l4", "l40s", "p100", "t4"]
    h200, l40s, l4 = get_spec("H200"), get_spec("l40s"), get_spec("L4")
    assert (h200.sm_count, h200.memory_bytes, h200.max_sm_clock_mhz) == (132, 143_771 * MIB, 1980)
    assert (l40s.sm_count, l40s.memory_bytes, l40s.max_sm_clock_mhz) == (142, 48 * GIB, 2520)
    assert (l4.sm_count, l4.memory_bytes, l4.max_sm_clock_mhz) == (58, 24 * GIB, 2040)
    for spec in GPU_SPECS.values():
        assert spec.name == spec.name.lower() and spec.relative_speed > 0 and 0 <= spec.clock_drop_frac < 0.5


def test_modelling_constants_keep_the_order_of_tensor_throughput_and_power() -> None:
    speed = {n: s.relative_speed for n, s in GPU_SPECS.items()}
    assert speed["t4"] < speed["l4"] < speed["a10"] < speed["l40s"] <= speed["a100"] < speed["h100"] < speed["h200"]
    drop = {n: s.clock_drop_frac for n, s in GPU_SPECS.items()}
    assert drop["h200"] <= drop["h100"] < drop["l40s"] < drop["a10"] < drop["t4"] < drop["l4"]


def test_an_unknown_type_is_a_key_error_printed_as_one_line() -> None:
    with pytest.raises(KeyError) as err:
        get_spec("v100")
    assert isinstance(err.value, UnknownGpuType)
    assert str(err.value) == err.value.args[0] == ("unknown GPU type 'v100' (known: a10, a100, h100, h200, k80, "
                                                   "l4, l40s, p100, t4)")
    assert f"error: {err.value}" == f"error: {err.value.args[0]}"


@pytest.mark.parametrize(("device", "gpu_type"), [
    ("NVIDIA H200", "h200"), ("NVIDIA H200 NVL", "h200"),
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", "h100"), ("NVIDIA H100 NVL", "h100"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA A100 80GB PCIe", "a100"),
    ("NVIDIA L40S", "l40s"), ("NVIDIA L4", "l4"), ("NVIDIA A10", "a10"),
    ("Tesla T4", "t4"), ("Tesla K80", "k80"), ("Tesla P100-PCIE-16GB", "p100"), ("Tesla P100-SXM2-16GB", "p100"),
    ("  nvidia   h200 ", "h200"),
])
def test_nvml_device_names_map_to_types(device, gpu_type) -> None:
    assert type_for_device_name(device) == gpu_type


@pytest.mark.parametrize(("device", "mib"), [
    ("NVIDIA H200", 143_771), ("NVIDIA H100 80GB HBM3", 81_559), ("NVIDIA A100-SXM4-80GB", 81_920),
    ("NVIDIA L40S", 46_068), ("NVIDIA L4", 23_034), ("NVIDIA A10", 23_028), ("Tesla T4", 15_360),
    ("Tesla K80", 11_441), ("Tesla P100-PCIE-16GB", 16_280),
])
def test_the_memory_nvml_reports_fits_the_type(device, mib) -> None:
    """NVML's total is a little below the marketed size (ECC, reserved): still the type."""
    assert type_for_device_name(device, mib * MIB) == type_for_device_name(device)


@pytest.mark.parametrize(("device", "memory", "says"), [
    ("NVIDIA A100-SXM4-40GB", None, "its name says 40 GiB"),
    ("NVIDIA A100-PCIE-40GB", None, "its name says 40 GiB"),
    ("Tesla P100-PCIE-12GB", None, "its name says 12 GiB"),
    ("NVIDIA A100-SXM4-80GB", 40 * GIB, "NVML reports 40 GiB"),
])
def test_a_smaller_memory_variant_is_no_type(device, memory, says) -> None:
    with pytest.raises(UnknownGpuDevice) as err:
        type_for_device_name(device, memory)
    msg = str(err.value)
    assert "\n" not in msg and repr(device) in msg and says in msg and "no known GPU type fits it" in msg
    assert "a10, a100, h100, h200, k80, l4, l40s, p100, t4" in msg


@pytest.mark.parametrize("device", ["NVIDIA L40", "NVIDIA A10G", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090",
                                    "NVIDIA B200", "", "NVIDIA"])
def test_unknown_devices_raise_one_line_naming_the_device_and_the_types(device) -> None:
    with pytest.raises(UnknownGpuDevice) as err:
        type_for_device_name(device)
    assert isinstance(err.value, ValueError)
    msg = str(err.value)
    assert "\n" not in msg and f"GPU device {device!r}" in msg
    assert msg.endswith("(a10, a100, h100, h200, k80, l4, l40s, p100, t4)")
