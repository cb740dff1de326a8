"""bench.ncu_lines: stall samples joined with a line table, on a made-up report; bench.resources:
the loops of a made-up SASS listing."""
from megakernel.bench.ncu_lines import line_table, samples_by_line

LINES = '''\t.text.megakernel_step:
        //## File "/x/templates/megakernel_ctx.cuh", line 17
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   SHFL.BFLY PT, R2, R3, 0x10, 0x1f ;
        //## File "/x/kernel.cu", line 83
        /*0020*/                   BAR.SYNC 0x1, R4 ;
'''
HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","stall_barrier",'
          '"stall_short_sb","stall_barrier (Not Issued)"')


def test_samples_land_on_their_source_lines(tmp_path):
    (tmp_path / "lines.sass").write_text(LINES)
    (tmp_path / "sass.csv").write_text("\n".join([
        '"Kernel Name","megakernel_step",', HEADER,
        '"0x7f0000001000","LDC","1","0","0","0"',
        '"0x7f0000001010","SHFL","3","0","3","0"',
        '"0x7f0000001020","BAR","6","6","0","6"']))
    table = line_table(str(tmp_path / "lines.sass"))
    assert table == {0: "megakernel_ctx.cuh:17", 0x10: "megakernel_ctx.cuh:17",
                     0x20: "kernel.cu:83"}
    per_line, why, everything = samples_by_line(str(tmp_path / "sass.csv"), table)
    assert everything == 10
    assert per_line == {"megakernel_ctx.cuh:17": 4, "kernel.cu:83": 6}
    assert why["kernel.cu:83"]["barrier"] == 6 and why["megakernel_ctx.cuh:17"]["short_sb"] == 3


SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;                   /* 0x00000a0000017a02 */
        /*0010*/                   LDG.E R2, desc[UR4][R4.64] ;             /* 0x0000000404027981 */
        /*0020*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR4][R6.64] ;  /* 0x0 */
        /*0030*/                   HMMA.16816.F32.BF16 R8, R12, R14, R8 ;   /* 0x0 */
        /*0040*/                   STL [R1+0x8], R2 ;                       /* 0x0 */
        /*0050*/               @P0 BRA 0x20 ;                               /* 0x0 */
        /*0060*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;            /* 0x0 */
        /*0070*/              @!P1 BRA 0x10 ;                               /* 0x0 */
        /*0080*/                   BRA 0x90 ;                               /* 0x0 */
        /*0090*/                   EXIT ;                                   /* 0x0 */
"""


def test_sass_loops_span_backward_branches_longest_first():
    """Two nested loops (0x20-0x50 inside 0x10-0x70); a forward branch is no loop; each loop's
    copies, MMAs, barriers, global loads and spills counted, predicates ignored."""
    from megakernel.bench.resources import sass_loops

    outer, inner = sass_loops(SASS)
    assert (outer["from"], outer["to"], outer["instructions"]) == ("0x10", "0x70", 7)
    assert (inner["from"], inner["to"], inner["instructions"]) == ("0x20", "0x50", 4)
    assert [outer[k] for k in ("copies", "mma", "barriers", "global loads", "spills")] == \
        [1, 1, 1, 1, 1]
    assert [inner[k] for k in ("copies", "mma", "barriers", "global loads", "spills")] == \
        [1, 1, 0, 0, 1]
    assert sass_loops(SASS, longest=1) == [outer]
