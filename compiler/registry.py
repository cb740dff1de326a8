"""The opcode registry: one :class:`OpSpec` per task kind. It drives both the Python encoder
(which words an instruction holds) and the generated dispatch (how the kernel turns those words
back into pointers and sizes), so the two cannot drift.

A field is one runtime argument of the op body, in order: ``act``/``f32`` words are offsets into
those arenas in units of ALIGN elements, ``weight`` words the weight's offset in its arena in the
same units (written when a model is bound), ``int`` words the value over its unit in the opcode
(the largest power of two up to ALIGN dividing every task's value; the dispatch multiplies back,
so Triton sees what divides it), ``ticket`` words a counter index (``SyncPlan``'s tickets
follow its counters), ``kernel`` fields name an argument the kernel itself receives, a
pointer, the launch's epoch or a GPU-only switch (no word). Compile-time sizes come
from ``constexprs(task, dims, cfg)``; tasks with equal kind and sizes share an opcode.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .ir import Dims, Task
from .tile import TileConfig, p2 as next_pow2


@dataclass(frozen=True)
class Field:
    name: str
    space: str   # act | f32 | weight | int | ticket | kernel


@dataclass(frozen=True)
class OpSpec:
    kind: str
    body: str        # the op body, as module.function under megakernel.compiler
    fields: tuple[Field, ...]
    constexprs: Callable[[Task, Dims, TileConfig], dict]
    prefetch: str = ""   # optional GPU-only body with the op body's arguments that asks L2 for
                         # what the task reads but no task writes, before its waits
    stage: str = ""      # optional GPU-only body with the op body's arguments that starts
                         # copying the first of the task's weights into shared memory before
                         # its waits (``staging``); the op body then waits for the worker's
                         # copy number ``copy`` to land and reads it

    @property
    def words(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if f.space != "kernel")


def p2(n: int, floor: int = 16) -> int:
    return max(floor, next_pow2(n))


def fold(bn: int, bk: int, d: Dims, c: TileConfig) -> int:
    """Column slices of a projection step folded into its dot (``ops.matmul_tile``): doubled,
    up to ``c.fold``, while the slices' batch rows stay within ``c.fold_rows`` (16: one
    tensor-core tile), the dot within 256 columns (its fp32 accumulator in registers) and each
    slice keeps 16 reduction columns. Tensor-core form only."""
    f = 1
    while c.form == 0 and 2 * f <= c.fold and 2 * f * next_pow2(d.batch) <= c.fold_rows \
            and 2 * f * bn <= 256 and bk // (2 * f) >= 16:
        f *= 2
    return f


def rows(d: Dims, c: TileConfig, folds: int = 1) -> int:
    """Batch rows per tile: padded to 16 for tensor cores (16 over the folds of a folded dot),
    to a power of two for the GEMV form."""
    return p2(d.batch, 1 if c.gemv else 16 // folds)


def rstd_block(k: int, rows: int, c: TileConfig) -> int:
    """Columns per step of a row's RMS: whole rows of up to 8K elements in one load, since each
    step of that loop costs a full memory latency."""
    return max(min(c.block_k, p2(k)), min(p2(k), 8192 // rows))


MAX_STAGES = 8


def stages(bn: int, bk: int, rows: int, d: Dims, c: TileConfig, weights: int = 1) -> int:
    """A projection loop's pipeline stages: ``c.stages``, or (``c.stage_kib``) as many as fit
    that much shared memory, up to MAX_STAGES, each stage holding a bn x bk step of each of
    ``weights`` matrices and rows x bk of x (folding keeps the same elements per step)."""
    if not c.stage_kib:
        return c.stages
    stage = (bn * weights + rows) * bk * d.itemsize
    return max(c.stages, min(MAX_STAGES, c.stage_kib * 1024 // stage))


def _projection(k: int, bn: int, bk: int, d: Dims, c: TileConfig, weights: int = 1) -> dict:
    """The constexprs every projection body takes for a step of bn x bk weights over K = k."""
    f = fold(bn, bk, d, c)
    r = rows(d, c, f)
    return dict(B=d.batch, K=k, BLOCK_B=r, BLOCK_K=bk, BLOCK_R=rstd_block(k, r, c), FORM=c.form,
                STAGES=stages(bn, bk, r, d, c, weights), RMS_UNROLL=c.rms_unroll, FOLD=f,
                **_rotate(c))


def _rotate(c: TileConfig) -> dict:
    """ROTATE for the projection bodies where ``proj_rotate`` asks for it (else nothing, so
    that other kernels' sources stay as they were)."""
    return {"ROTATE": 1} if c.proj_rotate else {}


def _sums(t: Task) -> dict:
    """Column groups of the sums of squares a normalising task takes its RMS from (0: from x),
    and the block that loads them at once."""
    groups = t.args.get("groups", 0)
    return dict(SUMS=groups, SUMS_BLOCK=next_pow2(max(groups, 1)))


def _linear(t: Task, d: Dims, c: TileConfig) -> dict:
    return dict(eps=t.args["eps"], N=t.args["n"], HAS_NORM=t.args["norm"] is not None,
                HAS_RES=t.args["residual"] is not None, BLOCK_N=t.args["bn"], **_sums(t),
                OUT_SUMS=t.args.get("osums") is not None,
                **_projection(t.args["k"], t.args["bn"], t.args["bk"], d, c),
                **_staged(t.args["k"], t.args["bn"], d, c))


def _staged(k: int, bn: int, d: Dims, c: TileConfig, weights: int = 1) -> dict:
    """Rows of a projection task (of each of its ``weights`` matrices) that a kernel with
    staging copies whole into shared memory (``staging``): as many of its ``bn`` as fit
    ``c.staged_kib`` KiB, a power of two; none where k is not a multiple of 8 (the staged
    read's 16-byte groups)."""
    fit = min(bn, c.staged_kib * 1024 // (weights * k * d.itemsize))
    if not fit or k % 8:
        return {}
    return dict(STAGED_ROWS=1 << (fit.bit_length() - 1))


def _linear_part(t: Task, d: Dims, c: TileConfig) -> dict:
    proj = _projection(t.args["ks"], t.args["bn"], t.args["bk"], d, c)
    return dict(B=d.batch, K=t.args["k"], KS=t.args["ks"], N=t.args["n"],
                BLOCK_B=proj["BLOCK_B"], BLOCK_N=t.args["bn"], BLOCK_K=t.args["bk"],
                FORM=c.form, STAGES=proj["STAGES"], FOLD=proj["FOLD"], **_rotate(c))


def _linear_part_reduce(t: Task, d: Dims, c: TileConfig) -> dict:
    red = _linear_reduce(t, d, c)
    return _linear_part(t, d, c) | dict(S=red["S"], HAS_RES=red["HAS_RES"],
                                        RED_ROWS=red["BLOCK_B"], SUMS=red["SUMS"])


def _linear_reduce(t: Task, d: Dims, c: TileConfig) -> dict:
    return dict(S=t.args["slices"], B=d.batch, N=t.args["n"],
                HAS_RES=t.args["residual"] is not None, BLOCK_B=p2(d.batch, 1),
                BLOCK_N=t.args["bn"], SUMS=t.args.get("sums") is not None)


def _reduce_norm(t: Task, d: Dims, c: TileConfig) -> dict:
    return dict(eps=t.args["eps"], S=t.args["slices"], B=d.batch, N=t.args["n"],
                HAS_RES=t.args["residual"] is not None, ROWS=next_pow2(t.args["rows"]),
                BLOCK_N=next_pow2(t.args["n"]))


def _rms_norm(t: Task, d: Dims, c: TileConfig) -> dict:
    return dict(eps=t.args["eps"], K=t.args["k"], ROWS=next_pow2(t.args["rows"]),
                BLOCK_K=next_pow2(t.args["k"]))


def _gate_up(t: Task, d: Dims, c: TileConfig) -> dict:
    return dict(eps=t.args["eps"], N=d.intermediate, BLOCK_N=t.args["bn"],
                HAS_NORM=t.args["norm"] is not None, **_sums(t),
                **_projection(d.hidden, t.args["bn"], t.args["bk"], d, c, weights=2),
                **_staged(d.hidden, t.args["bn"], d, c, weights=2))


def _embed(t: Task, d: Dims, c: TileConfig) -> dict:
    return dict(B=d.batch, H=d.hidden, BLOCK_B=p2(d.batch), BLOCK_N=t.args["bn"],
                SUMS=t.args.get("sums") is not None)


def _qkv(t: Task, d: Dims, c: TileConfig) -> dict:
    half = p2(t.args["part"])
    return dict(eps=t.args["eps"], qk_eps=t.args["qk_eps"], D=d.head_dim, HQ=d.heads,
                HKV=d.kv_heads, S=d.max_seq_len, BS=c.kv_block,
                HAS_HEAD_NORM=t.args["head_norm"] is not None, PART=t.args["part"], HALF=half,
                HAS_NORM=t.args["norm"] is not None, **_sums(t),
                RAW=t.args["raw"], OUT_COLS=(d.heads + d.kv_heads * t.args["raw"]) * d.head_dim,
                **_projection(d.hidden, 2 * half, t.args["bk"], d, c),
                **({"CROSS": 1} if t.args.get("cross") else {}))


def _qkv_part_rope(t: Task, d: Dims, c: TileConfig) -> dict:
    half = p2(t.args["part"])
    proj = _projection(t.args["ks"], 2 * half, t.args["bk"], d, c)
    return dict(eps=t.args["eps"], qk_eps=t.args["qk_eps"], B=d.batch, K=d.hidden,
                KS=t.args["ks"], D=d.head_dim, HQ=d.heads, HKV=d.kv_heads, S=d.max_seq_len,
                BS=c.kv_block, HAS_HEAD_NORM=t.args["head_norm"] is not None,
                BLOCK_B=proj["BLOCK_B"], PART=t.args["part"], HALF=half, BLOCK_K=t.args["bk"],
                FORM=c.form, STAGES=proj["STAGES"], FOLD=proj["FOLD"], SLICES=t.args["slices"],
                HAS_NORM=t.args["norm"] is not None, **_sums(t), **_rotate(c))


def _head_norm_rope(t: Task, d: Dims, c: TileConfig) -> dict:
    return dict(qk_eps=t.args["qk_eps"], B=d.batch, D=d.head_dim, HQ=d.heads, HKV=d.kv_heads,
                S=d.max_seq_len, BS=c.kv_block, RAW_COLS=(d.heads + d.kv_heads) * d.head_dim,
                BLOCK_B=p2(d.batch, 1), HALF=p2(d.head_dim // 2, 1))


# key groups of a pair's step with the keys as the dots' M (``TileConfig.attn_keys_m``): one a
# warp of 4
KEY_GROUPS = 4
# shared memory the attention loops with their block-table entries asked for before the loop
# (keys as M, stacked pair streams) may fill where their steps lie in single cache blocks: their
# pipeline then keeps STAGES - 1 steps of keys and values in shared memory (of the H200's 227
# KiB a block)
HELD_STAGE_KIB = 192


def held_stages(d: Dims, chunk: int, heads: int, stages: int, held: bool) -> int:
    """The pipeline stages of an attention loop over steps of ``chunk`` keys of ``heads`` kv
    heads: ``stages`` (the others'), or where the loop holds its steps' block-table entries
    from before it (``held``: each step in one cache block), at most as many as
    HELD_STAGE_KIB holds steps in flight."""
    if not held:
        return stages
    step = 2 * heads * chunk * p2(d.head_dim) * d.itemsize               # keys and values
    return max(2, min(stages, 1 + HELD_STAGE_KIB * 1024 // step))


def kv_chunk(t: Task, d: Dims, c: TileConfig) -> int:
    """Keys per step of an attention task: its whole span, up to c.kv_step key elements."""
    span = 1 << (t.args["kv_split"].bit_length() - 1)
    return max(16, min(span, c.kv_step // p2(d.head_dim)))


def _attn_body(d: Dims, c: TileConfig, chunk: int) -> dict:
    """The sizes every attention body takes, with ``chunk`` keys per step."""
    g = d.heads // d.kv_heads
    return dict(scale=d.head_dim ** -0.5, B=d.batch, HQ=d.heads, HKV=d.kv_heads,
                S=d.max_seq_len, D=d.head_dim, G=g, BS=c.kv_block, CHUNK=chunk,
                BLOCK_G=p2(g, c.attn_rows), BLOCK_D=p2(d.head_dim),
                STAGES=c.attn_stages or max(2, c.stages))


def _attn_partial(t: Task, d: Dims, c: TileConfig) -> dict:
    chunk = kv_chunk(t, d, c)
    fused = "ticket" in t.args
    return _attn_body(d, c, chunk) | dict(
        KV_SPLIT=t.args["kv_split"], DIRECT=t.args["direct"],
        PF_KEYS=min(1024, p2(t.args["kv_split"])),
        IN_BLOCK=c.kv_block % chunk == 0,       # tasks start at multiples of kv_block
        FUSED=fused, BLOCK_SPLIT=p2(t.args["nsplit"], 1) if fused else 1)


def _key_groups(chunk: int) -> int:
    """KEY_GROUPS, where a pair's steps of ``chunk`` keys leave each group a dot's 16 keys."""
    if chunk // KEY_GROUPS < 16:
        raise ValueError(f"attn_keys_m: a pair's steps of {chunk} keys leave fewer than 16 keys "
                         f"(a dot's least) to each of {KEY_GROUPS} groups")
    return KEY_GROUPS


def _attn_pair(t: Task, d: Dims, c: TileConfig) -> dict:
    chunk = kv_chunk(t, d, c)
    groups, body = _key_groups(chunk) if c.attn_keys_m else 1, _attn_body(d, c, chunk)
    in_block = c.kv_block % chunk == 0
    return body | dict(IN_BLOCK=in_block, W=groups, ROTATE=c.attn_rotate,
                       STAGES=held_stages(d, chunk, 2, body["STAGES"],
                                          c.attn_keys_m and in_block))


def _attn_pair_part(t: Task, d: Dims, c: TileConfig) -> dict:
    chunk = kv_chunk(t, d, c)
    fused = "ticket" in t.args
    return _attn_body(d, c, chunk) | dict(KV_SPLIT=t.args["kv_split"],
                                          IN_BLOCK=c.kv_block % chunk == 0, FUSED=fused,
                                          BLOCK_SPLIT=p2(t.args["count"], 1) if fused else 1)


def _attn_group(t: Task, d: Dims, c: TileConfig) -> dict:
    chunk = max(16, kv_chunk(t, d, c) * 2 // c.attn_group)    # as many keys x heads as a pair
    body, in_block = _attn_body(d, c, chunk), c.kv_block % chunk == 0
    return body | dict(IN_BLOCK=in_block, NH=c.attn_group, KEYS_M=c.attn_keys_m,
                       ROTATE=c.attn_rotate,
                       STAGES=held_stages(d, chunk, c.attn_group, body["STAGES"],
                                          c.attn_keys_m and in_block))


def _attn_stream(t: Task, d: Dims, c: TileConfig) -> dict:
    return _attn_body(d, c, t.args["step"]) | dict(ROWS=t.args["rows"])


def _stream_merges(t: Task) -> dict:
    fused = "merges" in t.args
    return dict(FUSED=fused, BLOCK_SPLIT=p2(t.args["nsplit"], 1) if fused else 1)


def _stream_held(t: Task, d: Dims, c: TileConfig, heads: int) -> dict:
    """A stream's arguments as its kind takes them; where its loop holds its steps' table
    entries (keys as M, or stacked pairs), the stages their steps in flight leave room for
    (``held_stages``)."""
    args = _attn_stream(t, d, c) | _stream_merges(t)
    held = (c.attn_keys_m or c.attn_stack and heads == 2) and c.kv_block % args["CHUNK"] == 0
    return args | dict(STAGES=held_stages(d, args["CHUNK"], heads, args["STAGES"], held))


def _attn_pair_stream(t: Task, d: Dims, c: TileConfig) -> dict:
    args = _stream_held(t, d, c, 2)
    args |= dict(W=_key_groups(args["CHUNK"])) if c.attn_keys_m else {}
    return args | (dict(STACK=t.args["units"], STEPS=t.args["steps"]) if c.attn_stack else {})


def _attn_group_stream(t: Task, d: Dims, c: TileConfig) -> dict:
    args = _stream_held(t, d, c, t.args["heads"]) | dict(NH=t.args["heads"])
    return args | dict(KEYS_M=True) if c.attn_keys_m else args


def _attn_combine(t: Task, d: Dims, c: TileConfig) -> dict:
    g = d.heads // d.kv_heads
    return dict(HQ=d.heads, D=d.head_dim, G=g, BLOCK_G=p2(g),
                BLOCK_SPLIT=p2(t.args["nsplit"], 1), BLOCK_D=p2(d.head_dim))


def _attn_group_combine(t: Task, d: Dims, c: TileConfig) -> dict:
    return _attn_combine(t, d, c) | dict(NH=t.args["heads"])


def _fields(spec: str) -> tuple[Field, ...]:
    """'x:act w:weight n0:int' -> Fields."""
    return tuple(Field(*item.split(":")) for item in spec.split())


# a stream over units of kv head groups: its keys, slots and (fused) its cut units' tickets
GROUP_STREAM = ("q:act cache_ptr:kernel positions_ptr:kernel block_table_ptr:kernel acc:f32 "
                "ml:f32 out:act f0:int f1:int layer:int slot0:int nslots:int counters_ptr:kernel "
                "epoch:kernel ticket:ticket first:int count_a:int count_b:int")
REGISTRY: dict[str, OpSpec] = {s.kind: s for s in [
    OpSpec("embed", "ops.embed_op",
           _fields("tokens_ptr:kernel table:weight out:act sums:f32 norm:weight scaled:act "
                   "n0:int"), _embed),
    OpSpec("linear", "ops.linear_op",
           _fields("x:act weight:weight norm:weight residual:act out:act sums:f32 osums:f32 "
                   "onorm:weight oscaled:act n0:int n1:int g:int copy:kernel STAGE:kernel"),
           _linear, stage="ops.linear_stage"),
    OpSpec("linear_part", "split_ops.linear_part_op",
           _fields("x:act weight:weight out:f32 n0:int n1:int k0:int s:int"), _linear_part),
    OpSpec("linear_part_reduce", "split_ops.linear_part_reduce_op",
           _fields("x:act weight:weight part:f32 residual:act out:act sums:f32 norm:weight "
                   "scaled:act n0:int n1:int k0:int s:int counters_ptr:kernel epoch:kernel "
                   "ticket:ticket"), _linear_part_reduce),
    OpSpec("linear_reduce", "split_ops.linear_reduce_op",
           _fields("part:f32 residual:act out:act sums:f32 norm:weight scaled:act n0:int "
                   "n1:int"), _linear_reduce),
    OpSpec("reduce_norm", "split_ops.reduce_norm_op",
           _fields("part:f32 residual:act norm:weight out:act xn:act r0:int r1:int"),
           _reduce_norm),
    OpSpec("rms_norm", "norm_ops.rms_norm_op",
           _fields("x:act norm:weight out:act r0:int r1:int"), _rms_norm),
    OpSpec("gate_up", "ops.gate_up_op",
           _fields("x:act norm:weight gate:weight up:weight out:act sums:f32 n0:int n1:int "
                   "copy:kernel STAGE:kernel"), _gate_up, stage="ops.gate_up_stage"),
    OpSpec("qkv_rope", "ops.qkv_rope_op",
           _fields("x:act norm:weight weight:weight head_norm:weight inv_freq:f32 "
                   "positions_ptr:kernel block_table_ptr:kernel out:act cache_ptr:kernel "
                   "sums:f32 kind:int head:int layer:int d0:int col:int"), _qkv),
    OpSpec("qkv_part_rope", "split_ops.qkv_part_rope_op",
           _fields("x:act weight:weight head_norm:weight inv_freq:f32 positions_ptr:kernel "
                   "block_table_ptr:kernel out:act cache_ptr:kernel sums:f32 partial:f32 "
                   "kind:int head:int layer:int d0:int s:int counters_ptr:kernel "
                   "epoch:kernel ticket:ticket"), _qkv_part_rope),
    OpSpec("head_norm_rope", "ops.head_norm_rope_op",
           _fields("raw:act head_norm:weight inv_freq:f32 positions_ptr:kernel "
                   "block_table_ptr:kernel out:act cache_ptr:kernel kind:int head:int layer:int "
                   "col:int"), _head_norm_rope),
    OpSpec("attn_partial", "attention_ops.attn_partial_op",
           _fields("q:act cache_ptr:kernel positions_ptr:kernel block_table_ptr:kernel acc:f32 "
                   "ml:f32 out:act row:int kv_head:int slot:int lo:int span:int layer:int "
                   "counters_ptr:kernel epoch:kernel ticket:ticket first:int count:int"),
           _attn_partial, "kv_prefetch.attn_partial_prefetch"),
    OpSpec("attn_pair", "attention_ops.attn_pair_op",
           _fields("q:act cache_ptr:kernel positions_ptr:kernel block_table_ptr:kernel out:act "
                   "row:int kv_head:int layer:int"), _attn_pair,
           "kv_prefetch.attn_pair_prefetch"),
    OpSpec("attn_pair_part", "attention_ops.attn_pair_part_op",
           _fields("q:act cache_ptr:kernel positions_ptr:kernel block_table_ptr:kernel acc:f32 "
                   "ml:f32 out:act row:int kv_head:int slot:int lo:int span:int layer:int "
                   "counters_ptr:kernel epoch:kernel ticket:ticket first:int count:int"),
           _attn_pair_part),
    OpSpec("attn_group", "attention_group_ops.attn_group_op",
           _fields("q:act cache_ptr:kernel positions_ptr:kernel block_table_ptr:kernel out:act "
                   "row:int kv_head:int layer:int"), _attn_group,
           "kv_prefetch.attn_group_prefetch"),
    OpSpec("attn_stream", "attention_ops.attn_stream_op",
           _fields("q:act cache_ptr:kernel positions_ptr:kernel block_table_ptr:kernel acc:f32 "
                   "ml:f32 out:act f0:int f1:int layer:int slot0:int"),
           _attn_stream),
    OpSpec("attn_pair_stream", "stream_ops.attn_pair_stream_op", _fields(GROUP_STREAM),
           _attn_pair_stream),
    OpSpec("attn_group_stream", "stream_ops.attn_group_stream_op", _fields(GROUP_STREAM),
           _attn_group_stream),
    OpSpec("attn_combine", "attention_ops.attn_combine_op",
           _fields("acc:f32 ml:f32 out:act row:int kv_head:int first:int count:int"),
           _attn_combine),
    OpSpec("attn_group_combine", "stream_ops.attn_group_combine_op",
           _fields("acc:f32 ml:f32 out:act row:int kv_head:int first:int count:int nslots:int"),
           _attn_group_combine),
]}

# The words before an op's fields, by name: encoder and kernel template both index them through
# HEADER, so they cannot drift. Weight tile to prefetch before waiting: weight, element offset
# within it, element count (0: nothing), and for a column slice of a matrix's rows the slice's
# elements a row and the matrix's row length (0, 0: one contiguous range); the first wait
# travels inline (most tasks have at most one).
HEADER = ("op", "first_wait", "num_waits", "signal", "prefetch_weight", "prefetch_offset",
          "prefetch_count", "prefetch_row", "prefetch_stride", "wait0_counter", "wait0_size")
HEADER_WORDS = len(HEADER)
NUM_WORDS = HEADER_WORDS + max(len(s.words) for s in REGISTRY.values())


def variant_key(task: Task, dims: Dims, cfg: TileConfig) -> tuple:
    spec = REGISTRY[task.kind]
    return (task.kind, tuple(sorted(spec.constexprs(task, dims, cfg).items())))
