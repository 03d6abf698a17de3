"""The built extension: it carries sm_90a GPU code (unless it was built without
the CUDA kernel), and a bare import loads it."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import flint_attention
import pytest
from flint_attention.ops import HAS_CUDA_KERNEL

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
    assert len(decode) >= 8, f"found {len(decode)} decode kernels"
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


def test_shipped_extension_has_no_testing_code():
    # The test-only ops live in flint_attention._testing: the operator's own
    # library neither registers them nor carries their kernels.
    data = extension_path().read_bytes()
    dynsym = elf_section(data, ".dynstr")
    assert b"flint_testing" not in data, "flint_testing in the shipped extension"
    assert b"pdl_token_writer" not in dynsym
