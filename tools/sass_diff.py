"""Which kernels' SASS differ between two builds: proof, without a GPU, that a
change left the other kernels instruction-for-instruction the same.

    python tools/sass_diff.py OLD NEW

OLD and NEW are objects or extensions holding sm_90a code (e.g. two cubins of
one csrc/decode_attention/kernels/*.cu, built with setup.py's nvcc flags plus
-cubin and without -lineinfo, or two python/flint_attention/_C*.so). Needs
cuobjdump and nvdisasm on PATH or in CUDA_HOME/bin; without a full toolkit
both come from PyPI: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
(their bin/ folders under site-packages/nvidia/cu13/). Addresses and encodings
are ignored. Exit status 1 when any kernel differs or exists in one build only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path


def find_tool(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    candidates = [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / name,
                  Path(sysconfig.get_paths()["purelib"]) / "nvidia" / "cu13" / "bin" / name]
    for c in candidates:
        if c.is_file():
            return str(c)
    sys.exit(f"sass_diff: {name} not found (see this script's docstring)")


def parse_sass(out: str) -> dict[str, list[str]]:
    """Each kernel's instructions in `cuobjdump -sass` output, without their
    addresses and encodings."""
    result: dict[str, list[str]] = {}
    body: list[str] | None = None
    for line in out.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            body = result.setdefault(m.group(1), [])
            continue
        # Instructions end with ';'. The fatbin headers between kernels (their
        # `identifier = <source path>` names the build's folder) are not code.
        instr = re.sub(r"/\*.*?\*/", "", line).strip()
        if body is not None and instr.endswith(";"):
            body.append(instr)
    return result


def kernels(path: str, cuobjdump: str, env: dict) -> dict[str, list[str]]:
    return parse_sass(subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True,
                                     env=env, check=True).stdout)


def main() -> int:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    cuobjdump = find_tool("cuobjdump")
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(find_tool("nvdisasm")) + os.pathsep + env.get("PATH", "")
    old, new = (kernels(p, cuobjdump, env) for p in sys.argv[1:])
    differ = 0
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        status = "same" if a == b else "only new" if a is None else "only old" if b is None else "DIFF"
        differ += status != "same"
        print(f"{status:8} {len(a or []):5} {len(b or []):5}  {name}")
    print(f"{len(set(old) | set(new))} kernels, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
