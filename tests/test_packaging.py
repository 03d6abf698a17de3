"""The built extension: it carries sm_90a GPU code (unless it was built without
the CUDA kernel), and a bare import loads it. The package: its metadata
(license, authors) and an sdist that carries the license and every source."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import flint_attention
import pytest
from flint_attention.ops import HAS_CUDA_KERNEL

ROOT = Path(__file__).resolve().parents[1]

needs_cuda_kernel = pytest.mark.skipif(
    not HAS_CUDA_KERNEL, reason="this build of flint has no CUDA kernel (FLINT_CPU_ONLY=1 or no nvcc)"
)


def extension_path() -> Path:
    [path] = Path(flint_attention.__file__).parent.glob("_C*.so")
    return path


def elf_section(data: bytes, name: str) -> bytes:
    """Contents of section ``name`` of a little-endian ELF64 file."""
    assert data[:4] == b"\x7fELF" and data[4] == 2, "not an ELF64 file"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i):  # (name offset, file offset, size) of section i
        sh_name, = struct.unpack_from("<I", data, shoff + i * shentsize)
        sh_offset, sh_size = struct.unpack_from("<QQ", data, shoff + i * shentsize + 0x18)
        return sh_name, sh_offset, sh_size

    _, strtab, _ = header(shstrndx)
    for i in range(shnum):
        sh_name, offset, size = header(i)
        if data[strtab + sh_name : data.index(b"\0", strtab + sh_name)].decode() == name:
            return data[offset : offset + size]
    raise AssertionError(f"no {name} section")


def fatbin_cubins(fatbin: bytes):
    """(arch, flags) of every cubin in a fatbin section.

    The fatbin format is not documented; this is the layout nvcc 12/13 write:
    a 16-byte header (magic 0xBA55ED50, version, header size, payload size),
    then entries with a u16 kind (1 PTX, 2 cubin) at 0, u32 header size at 4,
    u64 payload size at 8, u32 SM arch at 28 (90 for sm_90) and u64 flags at
    40, where 0x100000 marks arch-specific ("a") code.
    """
    pos = 0
    while pos + 16 <= len(fatbin):
        magic, _, header_size, size = struct.unpack_from("<IHHQ", fatbin, pos)
        if magic != 0xBA55ED50:
            break
        entry, end = pos + header_size, pos + header_size + size
        while entry < end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", fatbin, entry)
            arch, = struct.unpack_from("<I", fatbin, entry + 28)
            flags, = struct.unpack_from("<Q", fatbin, entry + 40)
            if kind == 2:
                yield arch, flags
            entry += entry_header + payload
        pos = end


@needs_cuda_kernel
def test_extension_has_sm90a_code():
    fatbin = elf_section(extension_path().read_bytes(), ".nv_fatbin")
    cubins = list(fatbin_cubins(fatbin))
    assert cubins, "no cubin in .nv_fatbin"
    assert all(arch == 90 and flags & 0x100000 for arch, flags in cubins), (
        f"expected only sm_90a cubins, got (arch, flags) {[(a, hex(f)) for a, f in cubins]}"
    )


def test_bare_import_registers_the_op():
    code = "import flint_attention; import torch; torch.ops.flint.decode_attention.default; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_libstdcxx_is_linked_dynamically():
    # A compiler that links libstdc++ statically (seen: a relocated GCC whose
    # lib folder has only libstdc++.a) puts a second libstdc++ in the process
    # next to torch's; the first std::locale use in the extension (formatting an
    # int in an error message) then crashes. Build with the system g++ instead.
    dynstr = elf_section(extension_path().read_bytes(), ".dynstr")
    assert b"libstdc++.so.6\0" in dynstr, "the extension does not link libstdc++.so.6 dynamically"


def find_cuobjdump() -> str | None:
    """cuobjdump from PATH, CUDA_HOME, or the copy Triton (a torch dependency) ships."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    candidates = [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "cuobjdump"]
    try:
        import triton

        candidates.append(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
    except ImportError:
        pass
    return next((str(c) for c in candidates if c.is_file()), None)


@needs_cuda_kernel
def test_every_decode_kernel_has_pdl_page_copies_and_mma_in_sass():
    # PDL paths that compile to nothing behind a macro are a known trap: read
    # the machine code. griddepcontrol.wait is ACQBULK, launch_dependents PREEXIT.
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        pytest.skip("cuobjdump not found (PATH, CUDA_HOME/bin, triton)")
    sass = subprocess.run([cuobjdump, "--dump-sass", str(extension_path())], capture_output=True,
                          text=True, check=True).stdout
    kernels = re.split(r"\n\s*Function : ", sass)[1:]
    decode = [k for k in kernels
              if re.match(r"_ZN5flint\d+decode_attention(_warp_per_head|_balanced)?_kernel", k)]
    assert len(decode) == len(variant_rows()), f"found {len(decode)} decode kernels"
    balanced = [k for k in decode if "balanced" in k.split("\n", 1)[0]]
    assert len(balanced) >= 2, f"found {len(balanced)} balanced kernels"
    for k in decode:
        name = k.split("\n", 1)[0]
        assert "ACQBULK" in k, f"no griddepcontrol.wait in {name}"
        assert "PREEXIT" in k, f"no griddepcontrol.launch_dependents in {name}"
        # bf16 pages come by bulk copies (UBLKCP), fp8 pages by tensor-map
        # copies (UTMALDG, the swizzled ring of KvFp8).
        copy = "UTMALDG" if "KvFp8" in name else "UBLKCP"
        assert copy in k and "HMMA" in k, f"no {copy} page copy / mma in {name}"
        assert not re.search(r"\b(LDL|STL)\b", k), f"local memory in {name}"


def variant_rows() -> list[tuple[str, str, int, int]]:
    """(family, format, warps, stages) of each row of the kernel list."""
    text = (ROOT / "csrc/decode_attention/kernels/variants.h").read_text()
    rows = re.findall(r"^\s*FLINT_VARIANT\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)", text, re.M)
    return [(family, fmt, int(warps), int(stages)) for family, fmt, warps, stages in rows]


@needs_cuda_kernel
def test_compiled_variants_are_the_rows_of_the_kernel_list():
    # One list names the kernels (variants.h): the extension's table follows it
    # row for row, in its order (a row's kernel is its own generated .cu).
    from flint_attention.testing import plans

    families = {"balanced": ("balanced", 0), "split": ("split", 4), "cluster4": ("cluster", 4),
                "warp_per_head": ("warp-per-head", 0)}
    want = [(*families[family], fmt, warps, stages) for family, fmt, warps, stages in variant_rows()]
    got = [(p.kind, p.splits, p.kv, p.warps, p.stages) for p in plans.variants()]
    assert len(want) == 14 and got == want


def test_shipped_extension_has_no_testing_code():
    # The test-only ops live in flint_attention._testing: the operator's own
    # library neither registers them nor carries their kernels.
    data = extension_path().read_bytes()
    dynsym = elf_section(data, ".dynstr")
    assert b"flint_testing" not in data, "flint_testing in the shipped extension"
    assert b"pdl_token_writer" not in dynsym


def test_metadata_and_sdist(tmp_path):
    # setuptools' own build hooks on a copy of the sources: the metadata a
    # wheel gets and the sdist, without compiling anything.
    src = tmp_path / "src"
    src.mkdir()
    for name in ["csrc", "python", "setup.py", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"]:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, src / name, **({"ignore": shutil.ignore_patterns("*.so", "*.egg-info", "__pycache__")}
                                        if (ROOT / name).is_dir() else {}))
    # Built as a laptop would build it: the sdist must carry the kernels all the same.
    env = dict(os.environ, FLINT_CPU_ONLY="1")

    def hook(name: str, folder: Path) -> str:
        """Runs build_meta.<name>(folder) in a fresh process; the name it returns."""
        folder.mkdir()
        code = f"from setuptools import build_meta; print('built', build_meta.{name}({str(folder)!r}))"
        result = subprocess.run([sys.executable, "-c", code], cwd=src, env=env, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        [built] = [line for line in result.stdout.splitlines() if line.startswith("built ")]
        return built.split()[1]

    dist_info = hook("prepare_metadata_for_build_wheel", tmp_path / "meta")
    sdist = hook("build_sdist", tmp_path / "sdist")

    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    meta = tmp_path / "meta" / dist_info
    assert (meta / "licenses" / "LICENSE").read_text() == license_text
    metadata = (meta / "METADATA").read_text().split("\n\n")[0].splitlines()
    for line in ["Name: flint-attention", "License-Expression: Apache-2.0", "License-File: LICENSE",
                 "Author: Flint developers", "Requires-Dist: torch>=2.11", "Requires-Python: >=3.10",
                 "Classifier: Environment :: GPU :: NVIDIA CUDA"]:
        assert line in metadata, (line, metadata)
    [summary] = [m for m in metadata if m.startswith("Summary: ")]
    assert "bf16 and fp8 caches" in summary, summary
    assert not [m for m in metadata if m.startswith(("Home-page", "Project-URL"))], "no URL is known: none is given"

    with tarfile.open(tmp_path / "sdist" / sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        pkg_info = tar.extractfile(f"{sdist.removesuffix('.tar.gz')}/PKG-INFO").read().decode()
    assert {"LICENSE", "pyproject.toml", "setup.py", "README.md"} <= names
    assert "License-Expression: Apache-2.0" in pkg_info.splitlines()
    sources = {str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*") if p.is_file()}
    assert sources <= names, f"missing from the sdist: {sorted(sources - names)[:10]}"
