import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cbsim.kv_blocks import KVBlockManager


def test_allocate_free_roundtrip():
    kv = KVBlockManager(8, 16)
    assert kv.num_free == 8 and kv.capacity_tokens == 128
    a = kv.allocate(3)
    assert a.dtype == np.int32 and a.tolist() == [0, 1, 2]
    b = kv.allocate(5)
    assert sorted(a.tolist() + b.tolist()) == list(range(8))
    assert kv.num_free == 0 and kv.num_used == 8
    with pytest.raises(RuntimeError, match="exhausted"):
        kv.allocate(1)
    kv.free(a)
    assert kv.num_free == 3
    assert sorted(kv.allocate(3).tolist()) == [0, 1, 2]


def test_blocks_needed():
    kv = KVBlockManager(4, 16)
    assert [kv.blocks_needed(t) for t in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]


def test_double_free_and_out_of_range_refused():
    kv = KVBlockManager(4, 2)
    a = kv.allocate(2)
    kv.free(a[:1])
    with pytest.raises(RuntimeError, match="freed twice"):
        kv.free(a[:1])
    with pytest.raises(RuntimeError, match="freed twice"):
        kv.free(np.array([a[1], a[1]]))
    with pytest.raises(IndexError):
        kv.free(np.array([7]))
    assert kv.num_free == 3


def test_a_repeat_anywhere_in_a_free_is_refused_and_frees_nothing():
    kv = KVBlockManager(8, 2)
    b = kv.allocate(6)
    with pytest.raises(RuntimeError, match="freed twice"):
        kv.free(np.array([b[0], b[3], b[1], b[3]]))
    assert kv.num_free == 2 and kv.used_blocks().size == 6
    kv.free(b[[4, 0, 5]])  # distinct ids after a refused call: the check's scratch is reused
    assert kv.num_free == 5


def test_bad_sizes():
    with pytest.raises(ValueError):
        KVBlockManager(0, 16)
    with pytest.raises(ValueError):
        KVBlockManager(4, 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 6)), max_size=40))
def test_random_ops_never_double_allocate(ops):
    kv = KVBlockManager(12, 4)
    held: list[np.ndarray] = []
    for alloc, n in ops:
        if alloc and kv.can_allocate(n):
            held.append(kv.allocate(n))
        elif held:
            kv.free(held.pop(n % len(held)))
        ids = np.concatenate(held) if held else np.empty(0, dtype=np.int32)
        assert np.unique(ids).size == ids.size
        assert ids.size + kv.num_free == kv.num_blocks
        assert sorted(kv.used_blocks().tolist()) == sorted(ids.tolist())
