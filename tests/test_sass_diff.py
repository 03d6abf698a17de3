"""tools/sass_diff.py's reading of `cuobjdump -sass` output (no GPU, no
toolkit): two builds of the same kernels in different folders compare equal,
a changed instruction does not."""

from __future__ import annotations

from tools import sass_diff


def dump(folder: str, second_instr: str = "S2R R6, SR_TID.X") -> str:
    """cuobjdump -sass output of two kernels in two fatbins built in `folder`
    (the fatbin header between them names the source file)."""
    def fatbin(name: str) -> str:
        return ("\nFatbin elf code:\n================\narch = sm_90a\ncode version = [1,8]\n"
                f"host = linux\ncompile_size = 64bit\nidentifier = {folder}/csrc/{name}.cu\n\n"
                "\tcode for sm_90\n")

    def kernel(name: str, instr: str) -> str:
        return (f"\t\tFunction : {name}\n"
                '\t.headerflags\t@"EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90"\n'
                "        /*0000*/                   LDC R1, c[0x0][0x28] ;"
                "                  /* 0x00000a00ff017b82 */\n"
                "                                                          /* 0x000fe20000000800 */\n"
                f"        /*0010*/                   {instr} ;"
                "                  /* 0x0000000000067919 */\n"
                "        /*0020*/              @!P0 BRA 0x10 ;"
                "                  /* 0x00000010002c8947 */\n"
                "        /*0030*/                   EXIT ;"
                "                  /* 0x000000000000794d */\n"
                "        .L_x_0:\n")

    return (fatbin("a") + kernel("_Z1av", "S2R R6, SR_TID.X") + fatbin("b")
            + kernel("_Z1bv", second_instr))


def test_builds_in_other_folders_compare_equal():
    old, new = sass_diff.parse_sass(dump("/tmp/one")), sass_diff.parse_sass(dump("/work/two"))
    assert sorted(old) == ["_Z1av", "_Z1bv"]
    assert old == new
    assert old["_Z1av"] == ["LDC R1, c[0x0][0x28] ;", "S2R R6, SR_TID.X ;", "@!P0 BRA 0x10 ;",
                            "EXIT ;"]


def test_a_changed_instruction_differs():
    old = sass_diff.parse_sass(dump("/tmp/one"))
    new = sass_diff.parse_sass(dump("/tmp/one", second_instr="S2R R7, SR_TID.X"))
    assert old["_Z1av"] == new["_Z1av"]
    assert old["_Z1bv"] != new["_Z1bv"]
