"""The benchmark scripts measure the checkout they are in: its package when
the extension is built in place there (another checkout may be the one
installed, e.g. in editable mode), else the installed one."""

import sys
from pathlib import Path

PYTHON_DIR = Path(__file__).resolve().parents[1] / "python"


def use_this_checkout() -> None:
    if list((PYTHON_DIR / "flint_attention").glob("_C*.so")) and str(PYTHON_DIR) not in sys.path:
        sys.path.insert(0, str(PYTHON_DIR))
