"""The pristine copies of an input set (`harness.worker.pristine`), on CPU tensors: the same code the
worker runs on the GPU, where the "device" is the CPU."""

from __future__ import annotations

import torch

from kb_mcp.harness.worker.pristine import Pristine


def a_set(seed: int, rows: int = 64) -> list[object]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, 32, generator=g), 7, torch.randint(0, 9, (rows,), generator=g),
            torch.rand(rows, generator=g) > 0.5]


def test_on_the_device_the_set_is_its_own_pristine_copy() -> None:
    xs = a_set(1)
    kept = Pristine("device").keep(xs)
    assert all(k is x for k, x in zip(kept, xs))


def test_on_the_host_the_copy_is_taken_now_and_holds_the_values() -> None:
    xs = a_set(1)
    store = Pristine("host")
    kept = store.keep(xs)
    assert kept[1] == 7
    for k, x in zip(kept, xs):
        if isinstance(x, torch.Tensor):
            assert k.data_ptr() != x.data_ptr() and k.dtype == x.dtype and k.shape == x.shape and torch.equal(k, x)
    assert store.host_bytes == sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor))


def test_a_write_into_an_input_is_found_and_put_back() -> None:
    for where in ("device", "host"):
        store = Pristine(where)  # type: ignore[arg-type]
        xs = a_set(2)
        kept = store.keep(xs)
        args = [x.clone() if isinstance(x, torch.Tensor) else x for x in xs] if where == "device" else xs
        assert store.changed(args, kept) == []
        args[0][3, 4] += 1.0  # type: ignore[index]
        args[2][0] = 99  # type: ignore[index]
        assert store.changed(args, kept) == [0, 2], where
        if where == "host":
            store.restore(args, kept, [0, 2])
            assert store.changed(args, kept) == []
            assert torch.equal(args[0], a_set(2)[0])  # type: ignore[arg-type]


def test_nan_kept_bit_for_bit_is_unchanged() -> None:
    store = Pristine("host")
    xs = [torch.tensor([1.0, float("nan"), 3.0])]
    kept = store.keep(xs)
    assert store.changed(xs, kept) == []
    xs[0][1] = 0.0
    assert store.changed(xs, kept) == [0]


def test_the_host_buffers_are_reused_set_after_set_and_grow_for_a_larger_one() -> None:
    store = Pristine("host")
    first = store.keep(a_set(1))
    ptr = first[0].data_ptr()  # type: ignore[union-attr]
    second = store.keep(a_set(2))
    assert second[0].data_ptr() == ptr  # type: ignore[union-attr]
    assert torch.equal(second[0], a_set(2)[0])  # type: ignore[arg-type]
    larger = store.keep(a_set(3, rows=256))
    assert torch.equal(larger[0], a_set(3, rows=256)[0])  # type: ignore[arg-type]
    assert store.host_bytes >= 256 * 32 * 4


def test_a_strided_input_is_kept_in_its_own_shape() -> None:
    base = torch.randn(32, 48)
    xs = [base.t(), torch.empty(0, 5)]
    kept = Pristine("host").keep(xs)
    assert kept[0].shape == (48, 32) and torch.equal(kept[0], base.t())
    assert kept[1].shape == (0, 5)
    assert Pristine("host").changed(xs, kept) == []
