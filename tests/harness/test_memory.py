"""The memory plan of a verification (`harness.gpu.memory`): pure arithmetic over a footprint and the free memory."""

from __future__ import annotations

import pytest

from kb_mcp.harness.gpu.memory import (
    FIXED_OVERHEAD_BYTES,
    GIB,
    Footprint,
    MemoryPlan,
    MemoryReport,
    TooLarge,
    bound,
    fits_eager,
    plan,
    reserve,
)

H100 = int(79.2 * GIB)  # what torch reports as an H100's total
H200 = int(139.8 * GIB)  # and an H200's


def fp(inputs: float, output: float, params: float = 0.0, peak: float | None = None) -> Footprint:
    return Footprint(input_bytes=int(inputs * GIB), output_bytes=int(output * GIB), param_bytes=int(params * GIB),
                     eager_peak_bytes=None if peak is None else int(peak * GIB))


def test_a_small_problem_keeps_its_pristine_copies_on_the_device() -> None:
    got = plan(fp(0.1, 0.1, 0.05), free_bytes=int(75 * GIB), total_bytes=H100)
    assert isinstance(got, MemoryPlan)
    assert got.pristine == "device" and got.poison_copies == 2
    assert got.needed_bytes <= got.free_bytes


def test_a_large_problem_keeps_them_on_the_host_before_it_is_refused() -> None:
    # 16 GiB of inputs: two sets on the device (plus outputs, reserve) no longer fit 45 GiB
    got = plan(fp(16, 4), free_bytes=int(45 * GIB), total_bytes=H100)
    assert isinstance(got, MemoryPlan) and got.pristine == "host"
    # with the reserve counted, the plan never claims more than is free
    assert got.needed_bytes <= int(45 * GIB)
    # and it says why the checks left the device, with the numbers
    assert "checks on the host" in got.note and "45.0 GiB free" in got.note


def test_a_large_problem_keeps_its_pristine_copies_on_the_device_where_they_fit() -> None:
    # KernelBench level-1 sizes on an H200: 6 GiB in, 6 GiB out, 130 GiB free
    got = plan(fp(6, 6), free_bytes=int(130 * GIB), total_bytes=H200)
    assert isinstance(got, MemoryPlan) and got.pristine == "device" and got.poison_copies == 2
    assert got.needed_bytes == 2 * int(6 * GIB) + 2 * int(6 * GIB) + int(6 * GIB) + reserve(H200)
    assert got.note == ""


def test_the_same_problem_goes_to_the_host_where_the_device_holds_less() -> None:
    f = fp(6, 6)
    device = plan(f, free_bytes=int(130 * GIB), total_bytes=H200)
    host = plan(f, free_bytes=int(35 * GIB), total_bytes=H200)
    assert isinstance(device, MemoryPlan) and isinstance(host, MemoryPlan)
    assert device.pristine == "device" and host.pristine == "host"
    assert host.needed_bytes < device.needed_bytes <= int(130 * GIB)


def test_the_caller_may_keep_the_checks_on_the_host() -> None:
    got = plan(fp(0.1, 0.1), int(75 * GIB), H100, prefer="host")
    assert isinstance(got, MemoryPlan) and got.pristine == "host" and "caller" in got.note
    assert plan(fp(0.1, 0.1), int(75 * GIB), H100, prefer="device").pristine == "device"  # type: ignore[union-attr]
    # asking for the device is no promise: where it does not fit, the host
    assert plan(fp(16, 4), int(45 * GIB), H100, prefer="device").pristine == "host"  # type: ignore[union-attr]


def test_the_bound_counts_the_larger_of_an_input_set_and_an_output() -> None:
    assert bound(fp(1, 3, peak=5), "host") == int(5 * GIB) + 2 * int(3 * GIB) + FIXED_OVERHEAD_BYTES
    assert bound(fp(4, 0.5), "host") == int(4.5 * GIB) + 2 * int(4 * GIB) + FIXED_OVERHEAD_BYTES


def test_checks_on_the_device_add_one_input_set_to_the_bound() -> None:
    f = fp(6, 6, peak=12)
    assert bound(f, "device") == bound(f, "host") + f.input_bytes
    assert bound(f, "device") == int(12 * GIB) + 2 * int(6 * GIB) + int(6 * GIB) + FIXED_OVERHEAD_BYTES


@pytest.mark.parametrize("inputs,output,params", [(6, 6, 0), (16, 0.14, 0), (0.5, 4, 1), (2, 2, 0.25)])
def test_the_device_plan_stays_within_the_device_bound(inputs: float, output: float, params: float) -> None:
    # what the plan counts beyond the reserve, less the candidate's own copy of the parameters (which
    # the bound leaves to its fixed overhead), is within the bound that the GPU test measures against
    f = fp(inputs, output, params, peak=inputs + output + params)
    got = plan(f, free_bytes=int(130 * GIB), total_bytes=H200)
    assert isinstance(got, MemoryPlan) and got.pristine == "device"
    counted = got.needed_bytes - reserve(H200) - f.param_bytes
    assert counted <= bound(f, "device") - FIXED_OVERHEAD_BYTES


def test_the_plan_counts_both_models_parameters_the_outputs_and_the_reserve() -> None:
    f = fp(0.1, 0.1, 3)
    got = plan(f, free_bytes=int(75 * GIB), total_bytes=H100)
    assert isinstance(got, MemoryPlan)
    expected = 2 * f.param_bytes + 2 * f.output_bytes + 2 * f.input_bytes + f.output_bytes + reserve(H100)
    assert got.needed_bytes == expected


def test_a_problem_whose_eager_forward_does_not_fit_is_refused_with_its_numbers() -> None:
    got = plan(fp(60, 20), free_bytes=int(75 * GIB), total_bytes=H100)
    assert isinstance(got, TooLarge) and got.what == "eager"
    text = got.text
    assert "too large for this GPU" in text and "needs about 80.0 GiB" in text
    assert "75.0 GiB free of 79.2 GiB" in text
    assert "inputs 60.0 GiB" in text and "output 20.0 GiB" in text


def test_eager_that_fits_but_no_verification_is_refused_as_a_verification() -> None:
    # eager (30 + 10 + 1) fits 50 GiB; two models and two outputs do not, in any mode
    got = plan(fp(30, 10, 1), free_bytes=int(50 * GIB), total_bytes=H100)
    assert isinstance(got, TooLarge) and got.what == "verification"
    assert "eager fits" in got.text
    assert fits_eager(got.footprint, int(50 * GIB))


def test_a_measured_eager_peak_counts_over_the_sizes() -> None:
    sizes = fp(10, 10, 0)
    measured = fp(10, 10, 0, peak=60)
    assert isinstance(plan(sizes, int(75 * GIB), H100), MemoryPlan)
    assert isinstance(plan(measured, int(75 * GIB), H100), TooLarge)
    assert measured.eager_bytes == int(60 * GIB) and sizes.eager_bytes == int(20 * GIB)


@pytest.mark.parametrize("free", [2, 10, 40, 75])
def test_a_plan_never_needs_more_than_is_free(free: float) -> None:
    for inputs in (0.001, 0.5, 4, 8, 16):
        got = plan(fp(inputs, inputs / 2, 0.1), int(free * GIB), H100)
        if isinstance(got, MemoryPlan):
            assert got.needed_bytes <= int(free * GIB)
        else:
            assert got.needed_bytes > 0 and got.free_bytes == int(free * GIB)


def test_the_report_prefers_the_device_peak_and_falls_back_to_the_workers() -> None:
    f = fp(1, 1)
    p = plan(f, int(75 * GIB), H100)
    assert isinstance(p, MemoryPlan)
    both = MemoryReport(footprint=f, plan=p, verify_peak_bytes=int(3 * GIB), census_peak_bytes=int(2 * GIB))
    assert both.peak_gib == 5.0
    sampled = both.model_copy(update={"device_peak_bytes": int(7.5 * GIB)})
    assert sampled.peak_gib == 7.5
    assert MemoryReport(footprint=f, plan=p).peak_gib is None
