"""The op against the float64 reference (and, on a GPU, against the CPU path)
over batch sizes, ragged lengths, windows, kv head counts and cache layouts.

Inputs are fresh random draws each run; a failure prints the seed to replay it
with make_paged_inputs(..., seed=SEED).
"""

from __future__ import annotations

import pytest
import torch
from conftest import GPU_VS_CPU, LAYOUTS, assert_close, check_against_reference, layout_grid, run_op

from flint_attention.testing import make_paged_inputs

SHORT = [0, 1, 15, 16, 17, 31, 32, 33]  # around the 16-token page boundary
LONG = [4097, 5000]


def ragged_seq_lens(batch: int) -> list[int]:
    """Page-boundary lengths in turn, request 0 empty (for batch > 1), every
    16th request 4097 long and the last one 5000 long."""
    lens = [SHORT[i % len(SHORT)] for i in range(batch)]
    for i in range(16, batch, 16):
        lens[i] = LONG[0]
    lens[-1] = LONG[1]
    return lens


BATCHES = [1, 3, 17, 64]
KV_HEADS = [1, 2, 8, 16]
WINDOWS = [None, 1, 128, 6000]  # 6000 > every seq_len here


@pytest.mark.parametrize("batch, num_kv_heads, window, layout", list(layout_grid(BATCHES, KV_HEADS, WINDOWS)))
def test_against_reference(device, batch, num_kv_heads, window, layout):
    inp = make_paged_inputs(
        batch, ragged_seq_lens(batch), num_kv_heads, window, device, **LAYOUTS[layout]
    )
    check_against_reference(inp, window)


@pytest.mark.parametrize("window", [None, 4096])
def test_long_sequence(device, window):
    inp = make_paged_inputs(2, [131072, 77777], 1, window, device, shared_pages=True)
    check_against_reference(inp, window)


@pytest.mark.parametrize("window", [None, 128])
def test_all_empty_writes_zeros(device, window):
    inp = make_paged_inputs(5, 0, 2, window, device)
    out = run_op(inp, window)
    assert torch.equal(out, torch.zeros_like(out))


def test_window_beyond_seq_len_is_full_attention(device):
    # Any window >= seq_len, even past int32, attends to everything. On the CPU
    # that is the same bits as window None; the GPU launches sliding-window
    # layers with another split configuration, so there every large window
    # gives the same bits and full attention agrees within GPU_VS_CPU.
    inp = make_paged_inputs(4, [1, 16, 17, 300], 2, None, device)
    full = run_op(inp, None).clone()
    first = None
    for window in [300, 2**31 - 1, 2**31, 2**40]:
        inp.out.fill_(float("nan"))
        out = run_op(inp, window).clone()
        if device == "cpu":
            assert torch.equal(out, full), f"window {window}"
        elif first is None:
            assert_close(out, full, GPU_VS_CPU, f"window {window} vs None")
            first = out
        else:
            assert torch.equal(out, first), f"window {window} vs 300"


def test_unattended_table_entries_may_hold_anything(device):
    # Entries for pages before the window or past seq_len may hold anything:
    # the CPU path (which rejects invalid ids in attended pages) does not check
    # them, and neither path's output changes. (The GPU clamps every id it
    # reads, so there this shows the output, not that they are never read.)
    window = 40
    inp = make_paged_inputs(3, [0, 100, 33], 2, window, device)
    expected = run_op(inp, window).clone()
    table = inp.block_tables.cpu()
    table[0, :] = -1
    table[1, : (100 - window) // 16] = -7  # pages 0..2 end before position 60
    table[1, 7:] = 2**31 - 1
    table[2, 3:] = -1
    inp.block_tables.copy_(table)
    inp.out.fill_(float("nan"))
    assert torch.equal(run_op(inp, window), expected)


@pytest.mark.parametrize("scale", [1e-3, 0.5, 3.0])
def test_scales(device, scale):
    inp = make_paged_inputs(3, [1, 33, 700], 1, None, device)
    check_against_reference(inp, None, scale)
