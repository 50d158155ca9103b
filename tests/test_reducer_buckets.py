"""Bucket assignment of the Reducer (a pure function): caps, dtype separation, order, determinism."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from strategies.reducer import assign_buckets


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 3000), st.sampled_from(["f32", "f64", "f16"])), min_size=1, max_size=40
    ),
    st.integers(1, 2000),
    st.integers(1, 4000),
    st.randoms(),
)
def test_assign_buckets_respects_caps(params: list, first_cap: int, cap: int, rnd) -> None:
    sizes, keys = [s for s, _ in params], [k for _, k in params]
    order = list(range(len(params)))
    rnd.shuffle(order)
    buckets = assign_buckets(sizes, keys, order, first_cap, cap)
    assert sorted(i for b in buckets for i in b) == sorted(order)
    assert buckets == assign_buckets(sizes, keys, order, first_cap, cap)  # deterministic
    position = {i: k for k, i in enumerate(order)}
    assert [position[b[0]] for b in buckets] == sorted(position[b[0]] for b in buckets)
    seen_keys: set[str] = set()
    for b in buckets:
        assert len({keys[i] for i in b}) == 1
        assert [position[i] for i in b] == sorted(position[i] for i in b)
        limit = cap if keys[b[0]] in seen_keys else first_cap
        seen_keys.add(keys[b[0]])
        assert len(b) == 1 or sum(sizes[i] for i in b) <= limit
