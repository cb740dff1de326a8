"""Tile the attention op: an attn_partial task per key range of each (row, kv head) unit
(``Tiler.kv_pieces``), partials in fp32 slots merged by one attn_combine per unit of several
ranges; a unit of one range writes its output itself (with ``attn_pairs``, where every unit is
one range: an attn_pair task per row and pair of kv heads, or an attn_group task per row and
group of ``attn_group``). With ``attn_stream``, the units' keys laid end to end are cut into
one equal share per worker (whole steps), an attn_stream task each; units cut between shares
are merged by an attn_combine."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .ir import Buffer, Region

if TYPE_CHECKING:
    from .tile import Tiler


def tile_attention(t: Tiler, op) -> None:
    if t.cfg.attn_stream:
        return tile_attention_stream(t, op)
    if t.attn_pairs():
        return tile_attention_pairs(t, op) if t.whole_units() else tile_attention_pair_parts(t, op)
    tile_attention_pieces(t, op)


def tile_attention_pairs(t: Tiler, op) -> None:
    """An attn_pair task per row and pair of kv heads (2h, 2h + 1), or an attn_group task per
    row and group of ``attn_group`` kv heads, where each unit's keys are one task's
    (``Tiler.attn_pairs``): the heads in one loop, each output written whole."""
    d = t.graph.dims
    q, out, layer = t.b(op.params["q"]), t.b(op.outputs[0]), op.params["layer"]
    group, hd, s, n = d.heads // d.kv_heads, d.head_dim, d.max_seq_len, t.cfg.attn_group
    for b in range(d.batch):
        for g in range(0, d.kv_heads, n):
            cols = ((b, b + 1), (g * group * hd, (g + n) * group * hd))      # the heads' q/out
            kv = Region("kv_cache", ((layer, layer + 1), (0, 2), (b, b + 1), (g, g + n), (0, s),
                                     (0, hd)))
            t.add(op, "attn_pair" if n == 2 else "attn_group",
                  dict(q=q.name, out=out.name, row=b, kv_head=g, layer=layer, kv_split=s,
                       heads=n),
                  [Region(q.name, cols), kv, Region("positions", ((0, d.batch),))],
                  [Region(out.name, cols)], 2 * (n * s * hd + n * group * hd) * d.itemsize,
                  2 * 2 * n * group * s * hd)


def partial_slots(t: Tiler, op, pieces) -> tuple[Buffer, Buffer]:
    """{op}.acc [P, G, D] and {op}.ml [P, G, 2]: a slot per key range of each unit of several
    (registered where there is one)."""
    d = t.graph.dims
    slots, group = sum(len(p) for p in pieces if len(p) > 1), d.heads // d.kv_heads
    acc = Buffer(f"{op.name}.acc", "f32", (slots, group, d.head_dim))
    ml = Buffer(f"{op.name}.ml", "f32", (slots, group, 2))
    if slots:
        t.buffers.update({acc.name: acc, ml.name: ml})
    return acc, ml


def add_combine(t: Tiler, op, acc, ml, b: int, g: int, first: int, count: int, most: int):
    """The attn_combine of unit (row b, kv head g): its ``count`` slots from ``first`` on."""
    d = t.graph.dims
    group, hd, out = d.heads // d.kv_heads, d.head_dim, t.b(op.outputs[0])
    used = ((first, first + count), (0, group))
    t.add(op, "attn_combine", dict(acc=acc.name, ml=ml.name, out=out.name, row=b, kv_head=g,
                                   first=first, count=count, nsplit=most),
          [Region(acc.name, used + ((0, hd),)), Region(ml.name, used + ((0, 2),))],
          [Region(out.name, ((b, b + 1), (g * group * hd, (g + 1) * group * hd)))],
          group * count * (hd + 2) * 4 + group * hd * d.itemsize, 0)


def tile_attention_pair_parts(t: Tiler, op) -> None:
    """An attn_pair_part task per row, pair of kv heads and key range of ``Tiler.kv_pieces``
    (the same ranges for every unit): both heads' partials into their units' slots, then an
    attn_combine per unit (with ``fuse_combine``: the pair's last part to take its ticket
    merges both units; every part declares both outputs as written)."""
    d = t.graph.dims
    q, layer, pieces = t.b(op.params["q"]), op.params["layer"], t.kv_pieces()
    out = t.b(op.outputs[0])
    group, hd, ranges = d.heads // d.kv_heads, d.head_dim, pieces[0]
    acc, ml = partial_slots(t, op, pieces)
    n, longest = len(ranges), max(hi - lo for lo, hi in ranges)
    for b in range(d.batch):
        for g in range(0, d.kv_heads, 2):
            first = (b * d.kv_heads + g) * n                  # unit (b, g)'s slots, then g + 1's
            cols = ((b, b + 1), (g * group * hd, (g + 2) * group * hd))
            merge = dict(ticket=t.tickets, first=first, out=out.name) \
                if t.cfg.fuse_combine else {}
            for s, (lo, hi) in enumerate(ranges):
                kv = Region("kv_cache", ((layer, layer + 1), (0, 2), (b, b + 1), (g, g + 2),
                                         (lo, hi), (0, hd)))
                writes = [Region(buf.name, ((f, f + 1), (0, group), (0, w)))
                          for f in (first + s, first + n + s) for buf, w in ((acc, hd), (ml, 2))]
                t.add(op, "attn_pair_part",
                      dict(q=q.name, acc=acc.name, ml=ml.name, row=b, kv_head=g, slot=first + s,
                           count=n, lo=lo, span=hi - lo, layer=layer, kv_split=longest,
                           heads=2, **merge),
                      [Region(q.name, cols), kv, Region("positions", ((0, d.batch),))],
                      writes + [Region(out.name, cols)] * bool(merge),
                      2 * ((2 * (hi - lo) * hd + group * hd) * d.itemsize + group * (hd + 2) * 4),
                      8 * group * (hi - lo) * hd)
            if merge:                     # the pair's last part merges both units (its ticket)
                t.tickets += 1
                continue
            for h in (g, g + 1):
                add_combine(t, op, acc, ml, b, h, first + (h - g) * n, n, n)


def tile_attention_pieces(t: Tiler, op) -> None:
    """An attn_partial task per key range of ``Tiler.kv_pieces`` of each (row, kv head); a unit
    in one range writes its output itself, the others' ranges write consecutive slots of
    {op}.acc [P, G, D] and {op}.ml [P, G, 2] and an attn_combine per unit merges them (with
    ``fuse_combine``: the unit's last piece to take its ticket merges them; every piece declares
    the unit's output as written, so its readers wait for all of them). Each
    kind's tasks loop over as many steps as its longest range takes (whole units and pieces
    are two opcodes: a piece does not step through a whole unit's keys masked)."""
    d = t.graph.dims
    q, out, layer = t.b(op.params["q"]), t.b(op.outputs[0]), op.params["layer"]
    group, hd, pieces = d.heads // d.kv_heads, d.head_dim, t.kv_pieces()
    longest = {}                 # keys of the longest task, of units in one range and in several
    for p in pieces:
        longest[len(p) == 1] = max([longest.get(len(p) == 1, 0)] + [hi - lo for lo, hi in p])
    most = max(len(p) for p in pieces)
    acc, ml = partial_slots(t, op, pieces)
    first, fused = 0, t.cfg.fuse_combine
    for b in range(d.batch):
        for g in range(d.kv_heads):
            ranges, heads = pieces[b * d.kv_heads + g], (g * group, (g + 1) * group)
            direct = len(ranges) == 1
            into = (dict(out=out.name, acc=None, ml=None) if direct     # where partials go
                    else dict(out=None, acc=acc.name, ml=ml.name))
            out_region = Region(out.name, ((b, b + 1), (heads[0] * hd, heads[1] * hd)))
            q_region = Region(q.name, ((b, b + 1), (heads[0] * hd, heads[1] * hd)))
            for s, (lo, hi) in enumerate(ranges):
                kv = Region("kv_cache", ((layer, layer + 1), (0, 2), (b, b + 1), (g, g + 1),
                                         (lo, hi), (0, hd)))
                slot = ((first + s, first + s + 1), (0, group))
                writes = [out_region] if direct else [Region(acc.name, slot + ((0, hd),)),
                                                      Region(ml.name, slot + ((0, 2),))]
                merge = dict(ticket=t.tickets, first=first, count=len(ranges), nsplit=most,
                             out=out.name) if fused and not direct else {}
                t.add(op, "attn_partial", dict(q=q.name, row=b, kv_head=g, slot=first + s,
                                               lo=lo, span=hi - lo, layer=layer,
                                               kv_split=longest[direct], direct=direct,
                                               **into | merge),
                      [q_region, kv, Region("positions", ((0, d.batch),))],
                      writes + [out_region] * bool(merge),
                      (2 * (hi - lo) * hd + group * hd) * d.itemsize + group * (hd + 2) * 4,
                      4 * group * (hi - lo) * hd)
            if direct:
                continue
            if fused:                     # the unit's last piece merges it (its ticket)
                t.tickets += 1
            else:
                add_combine(t, op, acc, ml, b, g, first, len(ranges), most)
            first += len(ranges)


def stream_shares(keys: int, seq: int, workers: int, step_keys: int) -> tuple[int, int]:
    """(keys per step, keys per stream) for ``keys`` = units * ``seq`` over ``workers``: the
    largest power-of-two step of at most ``step_keys`` (at least 16, a tensor-core dot's least)
    that divides ``seq``, and an equal share per worker rounded up to whole steps."""
    step = 1 << (min(max(16, step_keys), seq).bit_length() - 1)
    while seq % step:
        step //= 2
    if step < 16:
        raise ValueError(f"streamed attention needs max_seq_len={seq} a multiple of 16")
    share = -(-keys // workers)
    return step, -(-share // step) * step


def stream_plan(units: int, seq: int, cut: int):
    """Streams [(f0, f1)] of ``cut`` keys over ``units`` x ``seq`` keys laid end to end, each
    stream's pieces [(unit, lo, hi)], and the partial slot of each piece short of a whole unit,
    {(stream, unit): slot}, numbered in stream order (a unit's pieces in consecutive slots)."""
    total = units * seq
    streams = [(f0, min(total, f0 + cut)) for f0 in range(0, total, cut)]
    pieces = [[(u, max(f0, u * seq) - u * seq, min(f1, (u + 1) * seq) - u * seq)
               for u in range(f0 // seq, (f1 - 1) // seq + 1)] for f0, f1 in streams]
    slot_of: dict[tuple[int, int], int] = {}
    for i, ps in enumerate(pieces):
        for u, lo, hi in ps:
            if hi - lo < seq:
                slot_of[i, u] = len(slot_of)
    return streams, pieces, slot_of


def rows_spanned(streams: list, seq: int, units_per_row: int) -> int:
    """The most rows any of ``streams`` [(f0, f1)] spans (``seq`` keys a unit, ``units_per_row``
    units a row): the stream bodies' ROWS."""
    per_row = seq * units_per_row
    return max((f1 - 1) // per_row - f0 // per_row + 1 for f0, f1 in streams)


def unit_slots(slot_of: dict) -> dict[int, list[int]]:
    """{unit: its pieces' slots} of the units cut between streams."""
    slots: dict[int, list[int]] = {}
    for (_, u), slot in sorted(slot_of.items(), key=lambda kv: kv[1]):
        slots.setdefault(u, []).append(slot)
    return slots


def first_slots(streams: list, slot_of: dict) -> list[int]:
    """Each stream's ``slot0``: its first piece's slot (0 where it has none; slots are numbered
    in stream order, so a stream's first in ``slot_of`` is its lowest)."""
    first: dict[int, int] = {}
    for (i, _), slot in slot_of.items():
        first.setdefault(i, slot)
    return [first.get(i, 0) for i in range(len(streams))]


def stream_layout(t: Tiler) -> tuple:
    """(kv heads a unit, keys a step, streams, their pieces, the cut pieces' slots) of the
    attention op's streams (``stream_plan`` over ``Tiler.stream_heads`` units)."""
    d, nh = t.graph.dims, t.stream_heads()
    units, s = d.batch * d.kv_heads // nh, d.max_seq_len
    step_keys = t.cfg.kv_step // d.head_dim * 2 // max(2, nh)     # as many keys x heads as a pair
    step, cut = stream_shares(units * s, s, t.workers, step_keys)
    return (nh, step, *stream_plan(units, s, cut))


def tile_attention_stream(t: Tiler, op) -> None:
    """attn_stream task i: keys [i * cut, (i + 1) * cut) of the units laid end to end; a whole
    unit writes its output, a unit's piece a partial slot of {op}.acc / {op}.ml (numbered in
    stream order from the task's ``slot0``: each stream has at most a first and a last piece
    cut, and a unit's pieces take consecutive slots), merged by an attn_combine per cut unit.
    With ``Tiler.stream_heads`` nh > 1, units of nh kv heads of a row (attn_pair_stream tasks,
    or attn_group_stream with steps of as many keys x heads as a pair's), head h of piece p in
    slot p + h * P (P pieces), an attn_group_combine per cut unit merging each head's slots; or
    (``fuse_combine``) the cut unit's last piece to take its ticket merges it (``merge_args``),
    no combine task."""
    d, s = t.graph.dims, t.graph.dims.max_seq_len
    nh, step, streams, pieces, slot_of = stream_layout(t)
    q, out, layer = t.b(op.params["q"]), t.b(op.outputs[0]), op.params["layer"]
    group, hd, n, slots = d.heads // d.kv_heads, d.head_dim, len(slot_of), unit_slots(slot_of)
    acc, ml = (Buffer(f"{op.name}.{k}", "f32", (n * nh, group, w))
               for k, w in (("acc", hd), ("ml", 2)))
    if n:
        t.buffers.update({acc.name: acc, ml.name: ml})
    per_row = d.kv_heads // nh
    heads = lambda u: Region(out.name, ((u // per_row, u // per_row + 1),       # unit u's q/out
                                        (u % per_row * nh * group * hd,
                                         (u % per_row + 1) * nh * group * hd)))
    slot_boxes = lambda p: [Region(b.name, ((p + h * n, p + h * n + 1), (0, group), (0, w)))
                            for h in range(nh) for b, w in ((acc, hd), (ml, 2))]
    slot0s = first_slots(streams, slot_of)
    kind = {1: "attn_stream", 2: "attn_pair_stream"}.get(nh, "attn_group_stream")
    fused = t.cfg.fuse_combine and nh > 1
    tickets = {u: t.tickets + k for k, u in enumerate(slots)} if fused else {}
    most, rows = max(map(len, slots.values()), default=0), rows_spanned(streams, s, per_row)
    units, steps = max(map(len, pieces)), max(f1 - f0 for f0, f1 in streams) // step
    for i, ((f0, f1), ps) in enumerate(zip(streams, pieces)):
        reads, writes = [Region("positions", ((0, d.batch),))], []
        for u, lo, hi in ps:
            kv0 = u % per_row * nh
            reads += [Region(q.name, heads(u).box), Region("kv_cache", (
                (layer, layer + 1), (0, 2), (u // per_row, u // per_row + 1), (kv0, kv0 + nh),
                (lo, hi), (0, hd)))]
            slot = slot_of.get((i, u))
            writes += [heads(u)] if slot is None else slot_boxes(slot)
        args = dict(q=q.name, out=out.name, acc=acc.name if n else None,
                    ml=ml.name if n else None, f0=f0, f1=f1, layer=layer, slot0=slot0s[i],
                    step=step, rows=rows, units=units, steps=steps) | (
                        dict(nslots=n, heads=nh) if nh > 1 else {})
        cuts = [u for u, _, _ in ps if (i, u) in slot_of]
        if tickets and cuts:
            args |= merge_args(cuts, slots, tickets, slot0s[i], most, heads)
            writes += [r for _, r in args["merges"]]
        nbytes = (2 * (f1 - f0) * hd + len(ps) * group * hd) * nh * d.itemsize
        t.add(op, kind, args, reads, writes, nbytes + nh * group * (hd + 2) * 4,
              4 * nh * group * (f1 - f0) * hd)
    if fused:
        t.tickets += len(slots)
    else:
        add_stream_combines(t, op, slots, (acc, ml), heads, nh, most)


def add_stream_combines(t: Tiler, op, slots: dict, partials: tuple, heads, nh: int,
                        most: int) -> None:
    """An attn_combine (nh > 1: attn_group_combine) per cut unit u of ``slots`` {u: its slots}:
    it merges those slots of ``partials`` (acc [n * nh, G, D], ml [n * nh, G, 2], head h's in
    slot + h * n) into the unit's output ``heads(u)``; ``most``: the most slots a unit has."""
    d, (acc, ml) = t.graph.dims, partials
    group, hd, n, per_row = d.heads // d.kv_heads, d.head_dim, acc.shape[0] // nh, \
        d.kv_heads // nh
    for u, used in slots.items():
        boxes = [((used[0] + h * n, used[-1] + 1 + h * n), (0, group)) for h in range(nh)]
        args = dict(acc=acc.name, ml=ml.name, out=heads(u).buffer, row=u // per_row,
                    kv_head=u % per_row * nh, first=used[0], count=len(used), nsplit=most)
        t.add(op, "attn_combine" if nh == 1 else "attn_group_combine",
              args | (dict(nslots=n, heads=nh) if nh > 1 else {}),
              [Region(b.name, box + ((0, w),)) for box in boxes for b, w in ((acc, hd), (ml, 2))],
              [heads(u)], nh * (group * len(used) * (hd + 2) * 4 + group * hd * d.itemsize), 0)


def merge_args(cuts: list[int], slots: dict, tickets: dict, slot0: int, most: int,
               heads) -> dict:
    """A stream's arguments for merging its cut units (``cuts``: one or two, in order) as the
    last of their pieces: the first's ticket, first slot and pieces, the second's pieces (its
    ticket the next, its first slot ``slot0`` + 1: it begins in this stream), and ``merges``
    [(ticket, the unit's output)], what it declares as written for them."""
    a, b = cuts[0], cuts[1] if len(cuts) > 1 else None
    assert b is None or (tickets[b], slots[b][0]) == (tickets[a] + 1, slot0 + 1), (a, b)
    return dict(ticket=tickets[a], first=slots[a][0], count_a=len(slots[a]),
                count_b=len(slots[b]) if b is not None else 0, nsplit=most,
                merges=tuple((tickets[u], heads(u)) for u in cuts))
