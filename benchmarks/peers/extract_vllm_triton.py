"""Copies vLLM's Triton unified attention out of a vLLM wheel into
``.peers/vllm_triton/`` (git-ignored; carried to the GPU machine beside the
project), for ``peer_vllm.py`` to load with torch and triton only.

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 -d /tmp/vllm-wheel vllm==0.33.0
    python3 benchmarks/peers/extract_vllm_triton.py /tmp/vllm-wheel/vllm-0.33.0-*.whl

Only the two modules the kernel lives in and vLLM's license are taken; the
vllm modules they import (envs, logger, platforms, triton_utils,
kv_cache_interface) are replaced by stubs in ``peer_vllm.py``. A MANIFEST.json
records the wheel, its sha256 and the members' sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEST = REPO / ".peers" / "vllm_triton"
# Where the kernel lives in vLLM 0.33 (earlier releases had it under
# vllm/attention/ops/): the first member found of each list is taken.
MEMBERS = {
    "triton_unified_attention.py": ["vllm/v1/attention/ops/triton_unified_attention.py",
                                    "vllm/attention/ops/triton_unified_attention.py"],
    "triton_attention_helpers.py": ["vllm/v1/attention/ops/triton_attention_helpers.py",
                                    "vllm/attention/ops/triton_attention_helpers.py"],
}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def extract(wheel: Path, dest: Path = DEST) -> dict:
    dest.mkdir(parents=True, exist_ok=True)
    manifest = {"wheel": wheel.name, "wheel_sha256": _sha256(wheel.read_bytes()), "files": {}}
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        version = next((n.split("/")[0][len("vllm-"):-len(".dist-info")] for n in names
                        if n.endswith(".dist-info/METADATA")), "unknown")
        manifest["vllm_version"] = version
        wanted = dict(MEMBERS)
        wanted["LICENSE"] = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")
                             or n.endswith(".dist-info/LICENSE")]
        for out_name, candidates in wanted.items():
            member = next((c for c in candidates if c in names), None)
            if member is None:
                raise SystemExit(f"{wheel.name}: none of {candidates} found")
            data = z.read(member)
            (dest / out_name).write_bytes(data)
            manifest["files"][out_name] = {"member": member, "sha256": _sha256(data)}
    (dest / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("wheel", type=Path, help="a vllm-*.whl")
    p.add_argument("--dest", type=Path, default=DEST)
    args = p.parse_args(argv)
    m = extract(args.wheel, args.dest)
    print(f"vllm {m['vllm_version']}: {', '.join(m['files'])} -> {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
