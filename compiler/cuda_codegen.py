"""Generate the CUDA backend's kernel: Encoded tables -> CUDA C++ source.

    generate_cuda(enc, model, batch, num_tasks) -> CudaSource

The same instruction tables, waits and queues as the Triton kernel (``codegen``); only the code
that walks them differs. ``templates/megakernel.cu.jinja`` stitches the persistent loop and one
dispatch branch per opcode, for the worker's producer warp (each task's weight rows into a
shared-memory ring) and for its consumer warps (the op body); the op bodies are the structs of
``templates/megakernel_ops.cuh``. Each branch's arguments are built here from the registry, as
``codegen`` builds the Triton kernel's, so the words the encoder wrote are the words read. An
opcode the CUDA backend has no body for, or a variant of one it does not build, is an error that
names it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import jinja2

from .codegen import KERNEL_NAME, _template_dir
from .encode import ALIGN, Encoded
from .registry import HEADER, HEADER_WORDS, NUM_WORDS, REGISTRY

NCW = 8                    # consumer warps a worker
RING_BYTES = 192 * 1024    # the weight ring, at most
MIN_PAGE = 16 * 1024       # bytes a ring page, at least (larger where a weight row is longer)
MMA_FROM = 5               # batch rows from which projections run on tensor cores
X_BYTES = 32 * 1024       # x's chunk stages (tensor cores): about this many bytes, 4-12 stages
MMA_PAGE = 16 * 1024       # a tensor-core ring page's bytes, at least (a wider task's chunk: more)
MMA_CHUNKS = 4             # chunks of a narrow tensor-core task a page holds, at most
KC = 64                    # columns a tensor-core chunk (megakernel_mma.cuh)
NBOX = 5                   # TMA maps a row length: box heights 128, 64, 32, 16, 8
ATTN_RUNS = 1              # runs of keys a warp of a key-a-lane attention task has in flight
FLIGHT = 2                 # ring copies a worker has issued and not yet landed, at most
                           # (llama-3.2-1b, batch 1, H200, ms: 2 0.879, 4 0.887, 12 0.894)
ACQUIRE = ("none", "polls", "ticket", "both")   # which of the waits and the ticket acquire
SMEM_LIMIT = 232448        # dynamic shared memory a block may have on sm_90 (227 KB)
KERNEL_ARGS = ("tokens_ptr", "positions_ptr", "block_table_ptr", "cache_ptr", "counters_ptr",
               "epoch")                      # kernel fields the op bodies take by name


def _no_loop_norm(cx: dict) -> str:
    return "an RMSNorm inside the projection loop (norm_sums off)" \
        if cx.get("HAS_NORM") and not cx.get("SUMS") else ""


def _not_staged(cx: dict) -> str:
    return "staged weights (staged_kib)" if cx.get("STAGED_ROWS") else ""


def _qkv(cx: dict) -> str:
    for flag, what in (("RAW", "a raw q/k projection (split_head_norm)"),
                       ("CROSS", "pieces across heads (qkv_parts past a head)"),
                       ("HAS_HEAD_NORM", "a head RMSNorm (Qwen3)")):
        if cx.get(flag):
            return what
    return _no_loop_norm(cx)


def lanes_fit(d: int) -> bool:
    """Whether attention a key a lane builds for head dim d: each of a key's lanes scores whole
    16-byte groups."""
    lpk = d // 32 if d > 32 else 1
    return d % lpk == 0 and d // lpk % 8 == 0


def _mma_k(cx: dict) -> str:
    k = cx.get("KS", cx.get("K", 0))
    return f"tensor-core rows of whole 16-byte pieces: K {k}" if cx.get("MMA") and k % 8 else ""


def _part(cx: dict) -> str:
    return "" if cx.get("MMA") else \
        f"K slices (split_k) below {MMA_FROM} batch rows (tensor cores only)"


def _attention(cx: dict) -> str:
    if cx["LANES"] and not lanes_fit(cx["D"]):
        return f"a key a lane with head dim {cx['D']} (16-byte groups a lane)"
    return ""


@dataclass(frozen=True)
class CudaOp:
    struct: str                          # the op body's struct in megakernel_ops.cuh
    params: tuple[str, ...]              # constexprs as its template arguments, in order
    floats: tuple[str, ...] = ()         # float constexprs, as trailing call arguments
    unsupported: Callable[[dict], str] = field(default=lambda cx: "")   # "" if built
    rows: Callable[[dict], int] = field(default=lambda cx: 0)          # weight rows a task
    segs: int = 1                        # matrices (segments) those rows come from


CUDA_OPS: dict[str, CudaOp] = {
    "embed": CudaOp("mk::Embed", ("B", "H", "BLOCK_N", "SUMS")),
    "linear": CudaOp("mk::Linear", ("B", "K", "N", "HAS_NORM", "HAS_RES", "OUT_SUMS", "SUMS",
                                    "BLOCK_N"),
                     ("eps",), lambda cx: _no_loop_norm(cx) or _not_staged(cx) or _mma_k(cx),
                     lambda cx: cx["BLOCK_N"]),
    "linear_part": CudaOp("mk::LinearPart", ("B", "K", "KS", "N", "BLOCK_N"), (),
                          lambda cx: _part(cx) or _mma_k(cx), lambda cx: cx["BLOCK_N"]),
    "linear_reduce": CudaOp("mk::LinearReduce", ("S", "B", "N", "HAS_RES", "BLOCK_N", "SUMS")),
    "gate_up": CudaOp("mk::GateUp", ("B", "K", "N", "HAS_NORM", "SUMS", "BLOCK_N"), ("eps",),
                      lambda cx: _no_loop_norm(cx) or _not_staged(cx) or _mma_k(cx),
                      lambda cx: 2 * cx["BLOCK_N"], 2),
    "qkv_rope": CudaOp("mk::QkvRope", ("B", "K", "D", "HQ", "HKV", "S", "BS", "PART", "OUT_COLS",
                                       "HAS_NORM", "SUMS"), ("eps",),
                       lambda cx: _qkv(cx) or _mma_k(cx), lambda cx: 2 * cx["PART"], 2),
    "attn_partial": CudaOp("mk::AttnPartial", ("B", "HQ", "HKV", "S", "D", "G", "BS", "DIRECT",
                                               "FUSED", "LANES", "KV_RING", "KV_L2"),
                           ("scale",),
                           _attention),
    "attn_combine": CudaOp("mk::AttnCombine", ("HQ", "D", "G")),
}


@dataclass(frozen=True)
class CudaSource:
    source: str
    kernel_name: str
    num_workers: int
    threads: int        # a worker's threads: NCW consumer warps and the producer warp
    smem: int           # dynamic shared memory a worker takes, bytes
    map_ks: tuple[int, ...] = ()   # row lengths of the weight maps it takes (NBOX each)
    x_rows: int = 0     # rows of x's tensor copies (its maps' box height; tensor cores): B


def kv_ring_fits(cx: dict, geo: "Geometry") -> bool:
    """Whether an attention task's keys and values can stream through the ring: a cache block a
    page, and the pages of one step of the warps' runs (NCW runs of 16 keys or more, at most
    the task's keys; ``AttnPartial::lane_keys`` and ``MmaKeys``: K and V of every block it
    meets, one more where it starts inside one) and the next block at most the ring's, so that
    the slowest warp can always go on."""
    lpk = cx["D"] // 32 if cx["D"] > 32 else 1
    step = min(NCW * max(16, 32 // lpk), cx["KV_SPLIT"])   # keys a task's step, at most
    return cx["BS"] * cx["D"] * 2 <= geo.page and 2 * (-(-step // cx["BS"]) + 2) <= geo.npage


def knobs_of(cx: dict, lanes: bool | None, kv_ring: bool, geo: "Geometry",
             kv_l2: bool = False) -> dict:
    """The backend's own template arguments of an opcode with constexprs ``cx``: attention a key
    a lane where asked, or (``lanes=None``) where its head dim builds it; its keys and values
    through the ring where asked and they fit (``kv_ring_fits``), else, where ``kv_l2``,
    prefetched into L2 by the producer; and whether projections run on tensor cores."""
    lane = lanes_fit(cx.get("D", 0)) if lanes is None else lanes
    ring = kv_ring and lane and "KV_SPLIT" in cx and kv_ring_fits(cx, geo)
    return {"LANES": lane, "KV_RING": ring, "KV_L2": kv_l2 and not ring, "MMA": geo.mma}


def check_supported(enc: Encoded, lanes: bool | None, geo: "Geometry") -> None:
    """Raise ValueError naming every opcode the CUDA backend does not build (with the
    backend's own knobs, ``knobs_of``, beside the opcodes' constexprs)."""
    missing = []
    for op, kind, cx, _ in enc.variants:
        spec = CUDA_OPS.get(kind)
        why = "no CUDA body" if spec is None else spec.unsupported(
            cx | knobs_of(cx, lanes, False, geo))
        if why:
            missing.append(f"opcode {op} ({kind}): {why}")
    if missing:
        raise ValueError("the CUDA backend cannot build this kernel: " + "; ".join(missing))


def _literal(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v!r}f"
    return str(int(v))


def call_args(kind: str, cx: dict, units: dict) -> str:
    """The op struct's call arguments: its fields in registry order, then its float
    constexprs."""
    args, word = [], HEADER_WORDS
    for f in REGISTRY[kind].fields:
        if f.space == "kernel":
            if f.name in KERNEL_ARGS:
                args.append(f.name)
            continue
        w = f"w[{word}]"
        word += 1
        unit = units.get(f.name, 1)
        args.append({"act": f"act_ptr + (int64_t){w} * {ALIGN}",
                     "f32": f"f32_ptr + (int64_t){w} * {ALIGN}",
                     "weight": f"weights_ptr + (int64_t){w} * {ALIGN}",
                     "int": f"{w} * {unit}" if unit > 1 else w, "ticket": w}[f.space])
    args += [_literal(cx[name]) for name in CUDA_OPS[kind].floats]
    return ", ".join(args)


def page_rows(k: int, page: int) -> tuple[int, int]:
    """Rows of K elements a ring page holds and warps reading each (megakernel_ring.cuh's
    PageRows)."""
    fit = page // (2 * k)
    rows = next(r for r in (8, 4, 2, 1) if (fit >= r and NCW >= r) or r == 1)
    return rows, NCW // rows


@dataclass(frozen=True)
class Geometry:
    page: int
    npage: int
    acc: int      # floats of a task's row parts
    tmp: int      # floats of epilogue / attention-merge scratch
    mma: bool = False   # projections on tensor cores
    xbytes: int = 0     # their x chunks' stages, the stages' barriers, x's maps (XStages)

    def smem(self, batch: int) -> int:   # + slack to align the pages on 1024 bytes
        return (self.page * self.npage + self.xbytes + 16 * self.npage
                + 4 * (self.acc + self.tmp + batch + 2) + 1024)   # + rms, flag, progress


def padded(n: int, to: int) -> int:
    return -(-n // to) * to


def mma_groups(tiles: int) -> int:
    """Warp groups over a tensor-core task's 8-row tiles (``n_groups`` in megakernel_mma.cuh):
    two tiles a warp at most, a power of two up to NCW; the NCW / groups warps of a group split
    the chunks, each a part of acc."""
    groups = 1
    while groups < NCW and 2 * groups < tiles:
        groups *= 2
    return groups


def mma_parts(segs: int, rows: int) -> int:
    """Floats a batch row of acc a tensor-core task of ``segs`` x ``rows`` weight rows (or fewer)
    takes: its rows times its parts (NCW / ``mma_groups``)."""
    return max(segs * n * NCW // mma_groups(segs * padded(n, 8) // 8)
               for n in range(1, rows + 1))


def _proj_geometry(proj: list, batch: int, mma: int) -> tuple[int, int]:
    """A page's bytes and acc's floats for the projections ``proj`` [(kind, cx)]; ``mma``:
    tensor cores with pages of at least that many bytes (0: CUDA cores)."""
    if mma:   # a chunk of every segment's rows (8-row boxes, 128 bytes a row) a page at least
        page = max([CUDA_OPS[k].segs * padded(CUDA_OPS[k].rows(cx) // CUDA_OPS[k].segs, 8) * 128
                    for k, cx in proj] + [mma])
        return padded(page, 1024), max((mma_parts(CUDA_OPS[k].segs, CUDA_OPS[k].rows(cx)
                                                  // CUDA_OPS[k].segs) * batch
                                        for k, cx in proj), default=1)
    longest = max((cx["K"] for _, cx in proj), default=8)
    page = max(MIN_PAGE, -(-2 * longest // 1024) * 1024)
    return page, max((CUDA_OPS[kind].rows(cx) * page_rows(cx["K"], page)[1] * batch
                      for kind, cx in proj), default=1)


def x_stages(batch: int) -> int:
    """Stages of x's chunks: enough to cover L2's latency where a page is small."""
    return max(4, min(12, X_BYTES // (padded(batch, 16) * 2 * KC)))


def x_bytes(batch: int, stages: int) -> int:
    """Shared memory of x's chunk stages (``XStages`` in megakernel_mma.cuh): each stage's
    [batch padded to 16, KC] chunk and its two barriers, then where the copies come from."""
    return stages * (padded(batch, 16) * 2 * KC + 16) + 16


def geometry(enc: Encoded, batch: int, mma: int = 0, xs: int = 0) -> Geometry:
    """Ring pages long enough for the longest weight row (``mma`` > 0, tensor cores: a chunk of
    the largest task's rows, and at least ``mma`` bytes, beside ``xs`` stages of x's chunks,
    0: ``x_stages``), as many as fit RING_BYTES and the block's shared memory with the scratch
    the opcodes need."""
    proj = [(kind, cx) for _, kind, cx, _ in enc.variants
            if kind in CUDA_OPS and CUDA_OPS[kind].rows(cx)]
    page, acc = _proj_geometry(proj, batch, mma)
    tmp = max((CUDA_OPS[kind].rows(cx) * batch for kind, cx in proj), default=1)
    for _, kind, cx, _ in enc.variants:
        if kind == "embed":
            tmp = max(tmp, batch * cx["BLOCK_N"])
        elif kind == "linear_reduce":
            tmp = max(tmp, batch * cx["BLOCK_N"])
        elif kind == "attn_partial":
            tmp = max(tmp, NCW * cx["G"] * (2 + cx["D"]) + cx["G"] * cx["D"])  # merge, q
    xbytes = x_bytes(batch, xs or x_stages(batch)) if mma else 0
    geo = Geometry(page, max(2, RING_BYTES // page), acc, tmp, mma > 0, xbytes)
    while geo.npage > 2 and geo.smem(batch) > SMEM_LIMIT:
        geo = Geometry(page, geo.npage - 1, acc, tmp, mma > 0, xbytes)
    if geo.smem(batch) > SMEM_LIMIT:
        raise ValueError(f"the CUDA kernel needs {geo.smem(batch)} bytes of shared memory a "
                         f"worker, more than {SMEM_LIMIT}")
    return geo


def generate_cuda(enc: Encoded, model: str, batch: int, num_tasks: int,
                  flight: int | None = None, lanes: bool | None = None,
                  kv_ring: bool = False, probe: int = 0, kv_l2: bool = True,
                  acquire: str = "none", mma: bool | None = None,
                  mma_chunks: int = MMA_CHUNKS, mma_page_kib: int = MMA_PAGE // 1024,
                  kv_ahead: int = 0, attn_runs: int = ATTN_RUNS,
                  attn_mma: bool | None = None, x_depth: int = 0,
                  chunk_log: int = 0) -> CudaSource:
    """``flight``: copies a worker's producer keeps issued and not landed, at most (None:
    FLIGHT; batch 1: 2, 4, 8 for q/k/v and o only and 2 for the rest: 0.820, 0.825, 0.825 ms,
    llama-3.2-1b; tensor cores, 17 / 64 rows: 2 pages 2.109 / 3.590 ms, 3 pages 2.107 /
    3.619, any pages up to 64 KiB 2.167 / 3.690);
    ``probe``: traces stamp a task's end at a mark of its body (``MK_PROBE`` in
    megakernel_ctx.cuh) instead of its signal; ``lanes``: attention a key a lane
    (``AttnPartial::lane_keys``) or a key a warp; None: a key a lane where the head dim builds
    it (llama-3.2-1b, batch 1, H200, ms: a lane 0.831, a warp 0.865); ``kv_ring``: attention's
    keys and values copied into the ring by the producer where they fit (a key a lane only;
    0.838 against 0.833 without); ``kv_l2``: else the same cache blocks prefetched into L2 by
    the producer, no page taken (0.805 against 0.812 without); ``acquire``: which of a wait's
    polls and the fused combine's ticket are acquire operations ("none", "polls", "ticket",
    "both"; the others relaxed polls and a release atomic: ``poll_until`` in
    megakernel_ring.cuh); ``mma``: projections on tensor cores (megakernel_mma.cuh; None:
    from MMA_FROM batch rows on), their ring pages of at least ``mma_page_kib`` KiB holding
    up to ``mma_chunks`` 64-column chunks of a narrow task (a power of two); ``kv_ahead``: the
    producer's L2 prefetches of attention's cache held until the consumers are at most that
    many tasks behind (0: never); ``attn_runs``: runs of keys each warp of a key-a-lane
    attention task keeps in flight (``AttnPartial::lane_keys``); ``attn_mma``: attention's keys
    and values through the ring (as ``kv_ring``) scored and weighted on tensor cores
    (``MmaKeys``, megakernel_attention_mma.cuh); None: where the projections are (llama-3.2-1b,
    H200, ms, a key a lane / tensor cores: 17 rows 2.834 / 2.377, 64 rows 4.859 / 4.085; batch
    1, from L2 / tensor cores, 0.797 / 0.807); ``x_depth``: stages of x's chunks (0:
    ``x_stages``; thread 0 asks for chunks that many less two ahead); ``chunk_log``: traces
    also log that many of each worker's tensor-core chunks (the waits of warps 0 and NCW - 1)
    and ring pages (the producer's waits; ``runtime.trace.chunk_log``)."""
    _check_knobs(flight, acquire, probe, mma_chunks, kv_ahead, attn_runs, mma_page_kib, x_depth,
                 chunk_log)
    tensor = batch >= MMA_FROM if mma is None else mma
    attn_mma = tensor if attn_mma is None else attn_mma
    xs = x_depth or x_stages(batch)
    geo = geometry(enc, batch, mma_page_kib * 1024 if tensor else 0, xs)
    check_supported(enc, lanes, geo)
    flight = FLIGHT if flight is None else flight
    map_ks = sorted({cx["K"] for _, kind, cx, _ in enc.variants
                     if geo.mma and kind in CUDA_OPS and CUDA_OPS[kind].rows(cx)}) or [0]
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(_template_dir()),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    variants = dispatch_entries(enc, lanes, kv_ring or attn_mma, geo, kv_l2)
    source = env.get_template("megakernel.cu.jinja").render(
        kernel_name=KERNEL_NAME, model=model, batch=batch, num_tasks=num_tasks,
        num_workers=len(enc.queues), variants=variants, ncw=NCW, npage=geo.npage,
        page=geo.page, num_words=NUM_WORDS, acc=geo.acc, tmp=geo.tmp, flight=flight, probe=probe,
        mma_chunks=mma_chunks, kv_ahead=kv_ahead,
        attn_runs=attn_runs, attn_mma=attn_mma, chunk_log=chunk_log,
        acquire=acquire, acquire_polls=int(acquire in ("polls", "both")),
        acquire_ticket=int(acquire in ("ticket", "both")), mma=geo.mma, xs=xs,
        xbytes=geo.xbytes, map_ks=map_ks,
        h={name: f"w[{i}]" for i, name in enumerate(HEADER)})
    return CudaSource(source, KERNEL_NAME, len(enc.queues), 32 * (NCW + 1), geo.smem(batch),
                      tuple(map_ks) if geo.mma else (), batch)


def _check_knobs(flight, acquire, probe, mma_chunks, kv_ahead, attn_runs, mma_page_kib, x_depth,
                 chunk_log) -> None:
    """``generate_cuda``'s knobs in range, else a ValueError naming the knob."""
    if flight is not None and flight < 1:
        raise ValueError(f"flight={flight}: at least one copy must be in flight")
    if acquire not in ACQUIRE:
        raise ValueError(f"acquire={acquire!r}: one of {', '.join(ACQUIRE)}")
    if probe not in range(6):
        raise ValueError(f"probe={probe}: 0 (none) or a mark 1-5")
    if mma_chunks not in (1, 2, 4, 8, 16):
        raise ValueError(f"mma_chunks={mma_chunks}: a power of two up to 16")
    if kv_ahead < 0:
        raise ValueError(f"kv_ahead={kv_ahead}: tasks, 0 or more")
    if attn_runs not in (1, 2, 3, 4):
        raise ValueError(f"attn_runs={attn_runs}: 1 to 4")
    if not 1 <= mma_page_kib <= 128:
        raise ValueError(f"mma_page_kib={mma_page_kib}: 1 to 128")
    if not (x_depth == 0 or 3 <= x_depth <= 32):
        raise ValueError(f"x_depth={x_depth}: 0 (x_stages) or 3 to 32")
    if chunk_log < 0:
        raise ValueError(f"chunk_log={chunk_log}: entries, 0 or more")


def dispatch_entries(enc: Encoded, lanes, kv_pages: bool, geo, kv_l2: bool) -> list[dict]:
    """The template's dispatch: an opcode's kind, op struct with its template arguments
    (``knobs_of``; ``kv_pages``: attention's keys through the ring) and call arguments."""
    variants = []
    for op, kind, cx, units in enc.variants:
        spec = CUDA_OPS[kind]
        full = cx | knobs_of(cx, lanes, kv_pages, geo, kv_l2)
        struct = f"{spec.struct}<{', '.join(_literal(full[p]) for p in spec.params)}>"
        variants.append(dict(opcode=op, kind=kind, op=struct, args=call_args(kind, cx, units)))
    return variants
