"""L2 prefetches of what attention tasks read of earlier steps (GPU only; ``@triton.jit``): the
keys and values of the cache before this step's, which no task of the step writes, so a worker
may ask for them before the task's waits (``CompileOptions.prefetch_kv``) or while the task
before it in its queue waits (``CompileOptions.prefetch_kv_ahead``: the first AHEAD keys of
each of the next task's units).

Each body takes its attention op's arguments (the registry's ``prefetch`` of that kind) and
AHEAD (0: every key the task reads). The cache is [L, 2, B, Hkv, S, D] through the block
table, as in ``rope_ops.cache_slots``; a key's 128-byte lines are asked for one a lane, the
block-table entries of PF_KEYS keys in one gather (one memory latency per PF_KEYS keys).

A task ahead asks before its own waits, so every memory latency its prefetch waits for delays
it where its inputs are ready: in 24-row traces on the H200 the hops into q/k/v took 7.0 us a
step without and 38-46 us with the prefetch as first built, which loaded the next instruction's
words after the task's own, then for each head the row's position, then the block table. So the
words of both instructions are loaded at once (the kernel's template), and the AHEAD keys are
looked up without the row's position (every block-table entry names a block, ``rope_ops``), in
one gather for all of a task's heads (``ahead_slots``): one latency after the words.
"""
import triton
import triton.language as tl

from . import kernel_loop
from .attention_keys_m import step_rotation
from .rope_ops import block_slot, cache_block, cache_slots


@triton.jit
def prefetch_kv_lines(cache_ptr, bt_ptr, row, ss, layer, kv_head, B: tl.constexpr,
                      HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                      LAST: tl.constexpr = False):
    """Ask L2 for the keys and values at positions ss [N], one 128-byte line per lane, their
    block-table entries in one gather; LAST: with evict_last priority."""
    key = cache_slots(row, ss, bt_ptr, layer, 0, kv_head, B, HKV, S, D, BS)
    v_shift = B * HKV * S * D
    for d0 in tl.static_range(0, D, kernel_loop.LINE):
        kernel_loop.prefetch_line(cache_ptr + key + d0, LAST)
        kernel_loop.prefetch_line(cache_ptr + key + d0 + v_shift, LAST)


@triton.jit
def prefetch_keys(cache_ptr, pos_ptr, bt_ptr, row, kv_head, lo, hi, layer, B: tl.constexpr,
                  HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                  PF_KEYS: tl.constexpr, LAST: tl.constexpr = False):
    """Unit (row, kv_head)'s earlier keys and values [lo, min(hi, position)) (the key of this
    step comes from a q/k/v task), PF_KEYS at a time."""
    hi = tl.minimum(hi, tl.load(pos_ptr + row).to(tl.int32))
    k0 = lo
    while k0 < hi:
        ss = tl.minimum(k0 + tl.arange(0, PF_KEYS), hi - 1)                      # [PF_KEYS]
        prefetch_kv_lines(cache_ptr, bt_ptr, row, ss, layer, kv_head, B, HKV, S, D, BS, LAST)
        k0 += PF_KEYS


@triton.jit
def ahead_slots(bt_ptr, row, lo, n, S: tl.constexpr, BS: tl.constexpr, AHEAD: tl.constexpr):
    """Row ``row``'s positions lo .. lo + n - 1 (the last repeated up to AHEAD, all taken modulo
    S) [AHEAD] and their block-table entries [AHEAD], whatever the row's position."""
    ss = (lo + tl.minimum(tl.arange(0, AHEAD), n - 1)) % S                          # [AHEAD]
    return ss, cache_block(row, ss, bt_ptr, S, BS)


@triton.jit
def prefetch_ahead(cache_ptr, bt_ptr, row, kv_head, lo, n, layer, B: tl.constexpr,
                   HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                   NH: tl.constexpr, AHEAD: tl.constexpr, LAST: tl.constexpr = False):
    """Keys and values lo .. lo + n - 1 (``ahead_slots``, at most AHEAD) of kv heads kv_head ..
    kv_head + NH - 1 of row ``row``, one 128-byte line a lane (LAST: with evict_last
    priority)."""
    ss, block = ahead_slots(bt_ptr, row, lo, n, S, BS, AHEAD)
    v_shift = B * HKV * S * D
    for h in tl.static_range(NH):
        key = block_slot(block, ss, layer, 0, kv_head + h, B, HKV, S, D, BS)
        for d0 in tl.static_range(0, D, kernel_loop.LINE):
            kernel_loop.prefetch_line(cache_ptr + key + d0, LAST)
            kernel_loop.prefetch_line(cache_ptr + key + d0 + v_shift, LAST)


@triton.jit
def attn_partial_prefetch(q_ptr, cache_ptr, pos_ptr, bt_ptr, acc_ptr, ml_ptr, out_ptr, row,
                          kv_head, slot, lo, span, layer, counters_ptr, epoch, ticket, first,
                          count, scale: tl.constexpr,
                          B: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,
                          S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                          KV_SPLIT: tl.constexpr, BS: tl.constexpr,
                          CHUNK: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                          STAGES: tl.constexpr, DIRECT: tl.constexpr, PF_KEYS: tl.constexpr,
                          IN_BLOCK: tl.constexpr = False, FUSED: tl.constexpr = False,
                          BLOCK_SPLIT: tl.constexpr = 1, AHEAD: tl.constexpr = 0,
                          LAST: tl.constexpr = False):
    """``attn_partial_op``'s keys [lo, lo + span), or the first AHEAD of them (LAST: with
    evict_last priority)."""
    if AHEAD:
        prefetch_ahead(cache_ptr, bt_ptr, row, kv_head, lo, tl.minimum(span, AHEAD), layer, B,
                       HKV, S, D, BS, 1, AHEAD, LAST)
    else:
        prefetch_keys(cache_ptr, pos_ptr, bt_ptr, row, kv_head, lo, lo + span, layer, B, HKV, S,
                      D, BS, PF_KEYS, LAST)


@triton.jit
def attn_pair_prefetch(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr, row, kv_head, layer,
                       scale: tl.constexpr, B: tl.constexpr, HQ: tl.constexpr,
                       HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                       BS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_G: tl.constexpr,
                       BLOCK_D: tl.constexpr, STAGES: tl.constexpr, IN_BLOCK: tl.constexpr,
                       W: tl.constexpr = 1, ROTATE: tl.constexpr = False,
                       AHEAD: tl.constexpr = 0, LAST: tl.constexpr = False):
    """``attn_pair_op``'s keys of kv heads kv_head and kv_head + 1 (the first AHEAD of each)."""
    attn_group_prefetch(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr, row, kv_head, layer, scale, B,
                        HQ, HKV, S, D, G, BS, CHUNK, BLOCK_G, BLOCK_D, STAGES, IN_BLOCK, 2,
                        ROTATE=ROTATE, AHEAD=AHEAD, LAST=LAST)


@triton.jit
def attn_group_prefetch(q_ptr, cache_ptr, pos_ptr, bt_ptr, out_ptr, row, kv_head, layer,
                        scale: tl.constexpr, B: tl.constexpr, HQ: tl.constexpr,
                        HKV: tl.constexpr, S: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                        BS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_G: tl.constexpr,
                        BLOCK_D: tl.constexpr, STAGES: tl.constexpr, IN_BLOCK: tl.constexpr,
                        NH: tl.constexpr, KEYS_M: tl.constexpr = False,
                        ROTATE: tl.constexpr = False, AHEAD: tl.constexpr = 0,
                        LAST: tl.constexpr = False):
    """``attn_group_op``'s keys of kv heads kv_head .. kv_head + NH - 1 (the first AHEAD of
    each its loop reads; ROTATE: from the task's own step on)."""
    PF_KEYS: tl.constexpr = S if S < 1024 else 1024
    lo = step_rotation(row, kv_head, HKV, NH, (S + CHUNK - 1) // CHUNK) * CHUNK if ROTATE else 0
    if AHEAD:
        prefetch_ahead(cache_ptr, bt_ptr, row, kv_head, lo, AHEAD, layer, B, HKV, S, D, BS, NH,
                       AHEAD, LAST)
    else:
        for h in tl.static_range(NH):
            prefetch_keys(cache_ptr, pos_ptr, bt_ptr, row, kv_head + h, lo, lo + S, layer, B,
                          HKV, S, D, BS, PF_KEYS, LAST)
