"""The repository is a product, not a lab notebook (CPU only, needs a git
checkout): code and documents state a rule with its reason and a goal with its
formula, so they never cite a working session, a numbered run or a numbered
issue (the reader has neither), and no lab records (per-run logs, result
files, experiment patches) are tracked. The lab records are kept under the
tag lab-records-2026-12."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Pointers into a lab notebook: "session 34", "session log", "device runs
# 83-85", "run 159", "issue 21" / "issues #21". A loop index in a message
# ("differs from run 0") is no pointer, so a run number starts at 1.
FORBIDDEN = [
    re.compile(r"session [0-9]", re.IGNORECASE),
    re.compile(r"\bsessions? (log|note)", re.IGNORECASE),
    re.compile(r"device runs? [0-9]", re.IGNORECASE),
    re.compile(r"\bruns? [1-9][0-9]*\b", re.IGNORECASE),
    re.compile(r"\bissues? #?[0-9]{1,3}\b", re.IGNORECASE),
]
# The folders and files whose text is checked; csrc/ separately (below).
CHECKED = ("README.md", "docs", "python", "tests", "benchmarks", "tools")
# Prose and code; not data (the reference result's JSON records its own command line).
TEXT_SUFFIXES = {".md", ".py", ".sh", ".cu", ".cuh", ".h", ".cpp", ".txt", ".toml", ".cfg"}
# Lab records that must not come back into the tree.
LAB_RECORDS = ("benchmarks/logs", "benchmarks/results", "benchmarks/patches")


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          check=True).stdout


def _in_git_checkout() -> bool:
    if shutil.which("git") is None:
        return False
    try:
        return _git("rev-parse", "--show-toplevel").strip() == str(REPO)
    except (subprocess.CalledProcessError, OSError):
        return False


needs_git = pytest.mark.skipif(not _in_git_checkout(),
                               reason="not a git checkout (e.g. an unpacked sdist): nothing tracked to check")


def _tracked(*paths: str) -> list[str]:
    return [f for f in _git("ls-files", "-z", "--", *paths).split("\0") if f]


def _hits(paths: tuple[str, ...]) -> list[str]:
    """'file:line: text' for every line of a tracked text file under ``paths``
    that matches a forbidden pattern."""
    hits = []
    for rel in _tracked(*paths):
        path = REPO / rel
        if path.suffix not in TEXT_SUFFIXES or not path.is_file():
            continue
        if rel == "tests/test_repository.py":  # its own patterns and their examples
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if any(p.search(line) for p in FORBIDDEN):
                hits.append(f"{rel}:{n}: {line.strip()}")
    return hits


def test_patterns_catch_notebook_pointers():
    for text in ("session 34", "the session log", "device runs 83-85", "device run 45",
                 "(run 159)", "runs 82-85", "Runs 148-149", "issue 21", "issues 21 and 22", "issue #7"):
        assert any(p.search(text) for p in FORBIDDEN), text
    for text in ("differs from run 0", "a dry run", "runs on the CPU path", "issue slots",
                 "8 runs", "rerun 2 times later"):
        assert not any(p.search(text) for p in FORBIDDEN), text


@needs_git
def test_no_notebook_pointers_outside_csrc():
    hits = _hits(CHECKED)
    assert not hits, "sessions, numbered runs or issues cited:\n" + "\n".join(hits)


@needs_git
def test_no_notebook_pointers_in_csrc():
    hits = _hits(("csrc",))
    assert not hits, "sessions, numbered runs or issues cited:\n" + "\n".join(hits)


@needs_git
def test_no_lab_records_tracked():
    tracked = _tracked(*LAB_RECORDS)
    assert not tracked, "lab records are tracked:\n" + "\n".join(tracked)
