"""flint_attention.testing.serving: reproducible serving-shaped lengths,
capture-size padding, block tables drawn from a pool, the pool and its fp8
twin (CPU only)."""

from __future__ import annotations

import math

import pytest
import torch

from flint_attention import flint_decode_attention
from flint_attention.testing import BF16_VS_F64, FP8, assert_close, reference_decode_attention
from flint_attention.testing import serving as S


def test_lengths_are_reproducible_and_in_range():
    a = S.log_uniform(500, 16, 4096, seed=7)
    assert a == S.log_uniform(500, 16, 4096, seed=7)
    assert a != S.log_uniform(500, 16, 4096, seed=8)
    assert min(a) >= 16 and max(a) <= 4096
    # log-uniform: about as many below the geometric mean as above it
    below = sum(x < math.sqrt(16 * 4096) for x in a)
    assert 200 < below < 300
    u = S.uniform(100, 1024, 8192, seed=1)
    assert min(u) >= 1024 and max(u) <= 8192
    n = S.near_uniform(250, 2048, 0.1, seed=3)
    assert min(n) >= 1843 and max(n) <= 2252


def test_pinned_lengths():
    """The same seeds give the same lengths on every machine and Python
    (random.Random's sequence is stable): the benchmark row srv_b8_logu16k's."""
    assert S.log_uniform(8, 100, 16384, seed=2103) == [5283, 1342, 137, 3300, 822, 2132, 5416, 2112]
    assert S.uniform(3, 0, 1000, seed=0) == [844, 758, 421]


def test_one_long_and_bimodal():
    lens = S.one_long_many_short(13, 131072, 200, 2048, seed=5)
    assert len(lens) == 13 and lens.count(131072) == 1
    assert all(200 <= x <= 2048 for x in lens if x != 131072)
    b = S.bimodal(400, (100, 1024), (16384, 32768), 0.25, seed=9)
    long = [x for x in b if x >= 16384]
    assert all(x <= 1024 for x in b if x < 16384)
    assert 60 < len(long) < 140


@pytest.mark.parametrize("n,padded", [(1, 1), (3, 4), (20, 24), (50, 64), (129, 256), (500, 512), (600, 600)])
def test_capture_size_padding(n, padded):
    lens = S.pad_to_capture_size([5] * n)
    assert len(lens) == padded and lens[:n] == [5] * n and lens[n:] == [0] * (padded - n)


def test_page_span_and_summary():
    assert S.page_span(0, None) == range(0)
    assert S.page_span(16, None) == range(0, 1)
    assert S.page_span(17, None) == range(0, 2)
    assert S.page_span(8192, 128) == range(504, 512)
    assert S.page_span(130, 128) == range(0, 9)  # positions 2..129
    s = S.LengthSummary.of([100, 0, 20, 0, 35], window=None)
    assert (s.count, s.padding, s.min, s.median, s.max) == (5, 2, 20, 35, 100)
    assert s.attended_tokens == 155 and s.attended_pages == 7 + 2 + 3
    assert s.describe() == "3 requests + 2 padding, lengths 20/35/100 (min/median/max), 12 attended pages"
    assert S.LengthSummary.of([64, 64, 0]).describe() == "2 x 64 + 1 padding, 8 attended pages"


def test_block_tables_distinct_attended_pages():
    lens = [100, 0, 5000, 33, 8192]
    t = S.draw_block_tables(lens, None, num_blocks=4000, width=8192, n_sets=3, seed=1)
    assert t.shape == (3, 5, 8192) and t.dtype == torch.int32
    assert int(t.min()) >= 0 and int(t.max()) < 4000
    used = []
    for s in range(3):
        for b, n in enumerate(lens):
            used += t[s, b, S.page_span(n, None).start:S.page_span(n, None).stop].tolist()
    # 3 x 1168 attended pages fit 4000 blocks: distinct across the sets too
    assert len(used) == 3 * sum(-(-n // 16) for n in lens) and len(set(used)) == len(used)
    assert torch.equal(t, S.draw_block_tables(lens, None, 4000, 8192, 3, seed=1))


def test_block_tables_distinct_within_a_set_when_the_pool_is_small():
    lens = [800] * 10  # 500 pages a set, 3 sets > 1200 blocks
    t = S.draw_block_tables(lens, None, num_blocks=1200, width=64, n_sets=3, seed=2)
    for s in range(3):
        ids = t[s, :, :50].flatten().tolist()
        assert len(set(ids)) == len(ids)
    with pytest.raises(AssertionError):
        S.draw_block_tables([800] * 10, None, num_blocks=400, width=64, n_sets=1, seed=0)
    with pytest.raises(AssertionError):
        S.draw_block_tables([2000], None, num_blocks=400, width=64, n_sets=1, seed=0)


def test_window_tables_draw_only_attended_pages_distinct():
    lens = [32768] * 4
    t = S.draw_block_tables(lens, 128, num_blocks=40, width=2048, n_sets=1, seed=3)
    ids = t[0, :, 2040:2048].flatten().tolist()
    assert len(set(ids)) == 32  # 4 x 8 attended pages on distinct blocks of 40


def test_pool_views_and_fp8_twin():
    pool = S.KVPool.of_bytes(8 * 64 * 1024, 8, torch.bfloat16, "cpu")
    assert pool.num_blocks == 8 and pool.nbytes == 8 * 64 * 1024
    assert pool.view(8).shape == (8, 8, 16, 256) and pool.view(1).shape == (64, 1, 16, 256)
    assert pool.view(2).data_ptr() == pool.storage.data_ptr()
    with pytest.raises(AssertionError):
        pool.view(3)
    pool.fill_random(seed=4, chunk_bytes=3 * 64 * 1024)  # several chunks
    x = pool.storage.float()
    assert abs(float(x.mean())) < 0.02 and abs(float(x.std()) - 1) < 0.02
    ks, vs = torch.tensor([4 / 448]), torch.tensor([8 / 448])
    twin = pool.quantized_twin(ks, vs, chunk_bytes=64 * 1024)
    assert twin.dtype == FP8 and twin.view(8).shape == (8, 8, 16, 256)
    deq_k = twin.storage[..., :128].float() * ks
    deq_v = twin.storage[..., 128:].float() * vs
    small = pool.storage[..., :128].float().abs() < 3.9  # unsaturated
    assert torch.allclose(deq_k[small], pool.storage[..., :128].float()[small], rtol=2**-3, atol=1e-2)
    assert torch.allclose(deq_v, pool.storage[..., 128:].float(), rtol=2**-3, atol=2e-2)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, FP8])
def test_pool_inputs_run_on_the_cpu_path(kv_dtype):
    """A padded, ragged batch on pool-drawn tables through the op's CPU path
    matches the float64 reference (padding rows give zeros)."""
    lens = S.pad_to_capture_size(S.log_uniform(5, 1, 600, seed=11))  # 5 + 3 padding
    pool = S.KVPool(200, 8, torch.bfloat16, "cpu")
    pool.fill_random(seed=1)
    ks, vs = torch.tensor([4 / 448]), torch.tensor([8 / 448])
    if kv_dtype == FP8:
        pool = pool.quantized_twin(ks, vs)
    kvh = 2
    kv = pool.view(kvh)
    bt = S.draw_block_tables(lens, None, pool.blocks(kvh), width=64, n_sets=1, seed=2)[0]
    q = torch.randn(len(lens), 8 * kvh, 128, dtype=torch.bfloat16)
    sinks = torch.randn(8 * kvh)
    sl = torch.tensor(lens, dtype=torch.int32)
    scales = dict(k_scale=ks, v_scale=vs) if kv_dtype == FP8 else {}
    out = torch.full_like(q, math.nan)
    flint_decode_attention(q, kv, bt, sl, sinks, None, 128**-0.5, out, **scales)
    ref = reference_decode_attention(q, kv, bt, sl, sinks, None, 128**-0.5, *scales.values())
    assert_close(out, ref, BF16_VS_F64)
    assert (out[5:] == 0).all()
