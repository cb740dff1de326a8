"""bench.ncu_lines: stall samples joined with a line table, on a made-up report."""
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
