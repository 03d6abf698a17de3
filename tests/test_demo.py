"""The main job, python -m flint_attention: its arguments, its inputs for a seed,
and what it prints."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import needs_hopper

from flint_attention.__main__ import demo_inputs, demo_lens, main


@pytest.mark.parametrize("reps", ["0", "-1", "x"])
def test_bad_reps_is_a_usage_error(reps):
    result = subprocess.run([sys.executable, "-m", "flint_attention", "--reps", reps],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert f"argument --reps: must be an integer >= 1, got '{reps}'" in result.stderr
    assert "Traceback" not in result.stderr


def same(a, b):
    """Equal, NaN (the poison in unattended slots) included."""
    torch.testing.assert_close(a, b.cpu(), rtol=0, atol=0, equal_nan=True)


def test_a_seed_fixes_the_inputs():
    for a, b in zip(demo_inputs(7, 128, "cpu")[:6], demo_inputs(7, 128, "cpu")[:6]):
        same(a, b)
    assert demo_lens(7) != demo_lens(8)


@needs_hopper
def test_a_seed_gives_the_same_inputs_on_the_gpu():
    for a, b in zip(demo_inputs(7, None, "cpu")[:6], demo_inputs(7, None, "cuda")[:6]):
        assert b.is_cuda
        same(a, b)


def test_prints_the_tolerance_behind_ok(capsys):
    assert main(["--seed", "3", "--reps", "1"]) == 0
    text = capsys.readouterr().out
    assert "seed 3" in text
    assert "ok means, against the float64 reference: rel Frobenius err < 0.01 and |out - ref| <= 2**-6 + 2**-8 |ref|" in text
    lines = [line for line in text.splitlines() if line.startswith("window")]
    assert len(lines) == 2 and all("of its bound -> ok" in line for line in lines)
    assert "replay: python -m flint_attention --seed 3" in text
