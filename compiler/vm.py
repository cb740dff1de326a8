"""Reference VM: runs a TaskGraph tile by tile in PyTorch, in an order its Schedule allows.

``run_vm(compiled, model, tokens [B], positions [B], kv_cache)`` returns ``{buffer: tensor}`` for
every activation and scratch buffer (and updates ``kv_cache`` in place). Each task kind has a
PyTorch tile function with the rounding points of the Triton op body, so tests can diff the
generated kernel against this buffer by buffer. Workers advance round-robin, each running its
next task once all its dependencies have run: a schedule that deadlocks raises.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .schedule import DeadlockError


def rms(x: torch.Tensor, w: torch.Tensor | None, eps: float, dt) -> torch.Tensor:
    """RMSNorm(x) * w rounded as the op bodies round it."""
    if w is None:
        return x.to(dt)
    xf = x.float()
    xn = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dt)
    return (w.float() * xn.float()).to(dt)


def mm(x: torch.Tensor, w: torch.Tensor, dt) -> torch.Tensor:
    return (x.float() @ w.float().T).to(dt)


def merge_partials(acc: torch.Tensor, ml: torch.Tensor) -> torch.Tensor:
    """Partials of one (row, kv head) over several key ranges, acc [P, G, D] and (max, sum)
    ml [P, G, 2] -> the normalised output [G, D]."""
    w = torch.exp(ml[..., 0] - ml[..., 0].max(0).values)                      # [P, G]
    return (w[..., None] * acc).sum(0) / (w * ml[..., 1]).sum(0)[:, None]


def pair_rows(pair: torch.Tensor, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE pairs [n] of heads of 2 * half dims laid end to end -> their rows of the heads'
    weight (or columns of q) [2n], lo halves then hi halves, and those dims within each head."""
    head, dim = pair // half, pair % half
    local = torch.cat([dim, dim + half])
    return torch.cat([head, head]) * 2 * half + local, local


class VM:
    def __init__(self, compiled, model, tokens, positions, kv_cache):
        self.c, self.d = compiled, compiled.ops.dims
        self.dt = next(model.parameters()).dtype
        self.buf = {}
        for name, b in compiled.tasks.ops.buffers.items():
            if b.space == "weight":
                self.buf[name] = model.get_parameter(name).detach()
            elif b.space == "f32" and name in dict(model.named_buffers()):
                self.buf[name] = model.get_buffer(name).float()
            elif b.space in ("act", "f32"):
                dt = self.dt if b.space == "act" else torch.float32
                self.buf[name] = torch.full(b.shape, float("nan"), dtype=dt, device=kv_cache.device)
        self.buf.update(tokens=tokens.view(-1), positions=positions.view(-1), kv_cache=kv_cache)
        self.tickets: dict[int, int] = {}        # fused merges and reduces: pieces done

    def w(self, name):
        return None if name is None else self.buf[name]

    def project(self, a, *ws):
        """The task's input x through its norm (if any) @ w^T for each w, rounded: x normalised
        first, or (``sums``) x scaled by the norm's weight already and each row of the product
        by its RMS, taken from the column groups' sums of squares [G, B]."""
        x = self.buf[a["x"]]
        if a.get("sums") is None:
            xn = rms(x, self.w(a["norm"]), a["eps"], self.dt)
            return [mm(xn, w, self.dt) for w in ws]
        rstd = torch.rsqrt(self.buf[a["sums"]].sum(0) / x.shape[-1] + a["eps"])      # [B]
        return [((x.float() @ w.float().T) * rstd[:, None]).to(self.dt) for w in ws]

    def embed(self, a):
        lo = a["n0"]
        hi = lo + a["bn"]
        self.buf[a["out"]][:, lo:hi] = y = self.buf[a["table"]][self.buf["tokens"], lo:hi]
        self.norm_inputs(y, lo, hi, lo // a["bn"], a["sums"], a["norm"], a["scaled"])

    def norm_inputs(self, y, lo, hi, g, sums, norm, scaled):
        """Where ``sums`` is a buffer: into its column group g the sums of squares of y
        [B, hi - lo] (x's columns lo:hi), and into ``scaled`` those columns times the next
        norm's weight ``norm``."""
        if sums is not None:
            self.buf[sums][g] = y.float().pow(2).sum(-1)
            self.buf[scaled][:, lo:hi] = (y.float() * self.buf[norm][lo:hi].float()).to(self.dt)

    def linear(self, a):
        lo, hi = a["n0"], a["n1"]
        y, = self.project(a, self.buf[a["weight"]][lo:hi])
        self.buf[a["out"]][:, lo:hi] = y = self.plus_residual(a, y)
        self.norm_inputs(y, lo, hi, a["g"], a["osums"], a["onorm"], a["oscaled"])

    def plus_residual(self, a, y, where=None):
        """y (rounded) plus the task's residual at ``where`` (default its columns n0:n1 of
        every row), if any, rounded."""
        if a["residual"] is None:
            return y
        where = (slice(None), slice(a["n0"], a["n1"])) if where is None else where
        return (self.buf[a["residual"]][where].float() + y.float()).to(self.dt)

    def linear_part(self, a):
        lo, hi, k0, k1 = a["n0"], a["n1"], a["k0"], a["k0"] + a["ks"]
        x, w = self.buf[a["x"]][:, k0:k1], self.buf[a["weight"]][lo:hi, k0:k1]
        self.buf[a["out"]][a["s"], :, lo:hi] = x.float() @ w.float().T

    def linear_part_reduce(self, a):
        self.linear_part(a | dict(out=a["part"]))
        if self.last_ticket(a["ticket"], a["slices"]):
            self.linear_reduce(a)

    def last_ticket(self, ticket: int, count: int) -> bool:
        """Takes ``ticket``: whether this task is the last of its ``count`` to take it."""
        self.tickets[ticket] = self.tickets.get(ticket, 0) + 1
        return self.tickets[ticket] == count

    def linear_reduce(self, a):
        lo, hi = a["n0"], a["n1"]
        y = self.plus_residual(a, self.buf[a["part"]][:, :, lo:hi].sum(0).to(self.dt))
        self.buf[a["out"]][:, lo:hi] = y
        self.norm_inputs(y, lo, hi, lo // a["bn"], a["sums"], a["norm"], a["scaled"])

    def reduce_norm(self, a):
        r0, r1 = a["r0"], a["r1"]
        y = self.plus_residual(a, self.buf[a["part"]][:, r0:r1].sum(0).to(self.dt),
                               slice(r0, r1))
        self.buf[a["out"]][r0:r1] = y
        self.buf[a["xn"]][r0:r1] = rms(y, self.w(a["norm"]), a["eps"], self.dt)

    def rms_norm(self, a):
        r0, r1 = a["r0"], a["r1"]
        self.buf[a["out"]][r0:r1] = rms(self.buf[a["x"]][r0:r1], self.w(a["norm"]), a["eps"],
                                        self.dt)

    def gate_up(self, a):
        lo, hi = a["n0"], a["n1"]
        g, u = self.project(a, self.buf[a["gate"]][lo:hi], self.buf[a["up"]][lo:hi])
        self.buf[a["out"]][:, lo:hi] = (F.silu(g.float()).to(self.dt).float() * u.float()).to(self.dt)

    def qkv_rope(self, a):
        """``part`` RoPE pairs (dim i with i + D/2 of a head) from pair d0 of head ``head`` on:
        within the head, or (``cross``) on through the kind's next heads."""
        d, dt, half = self.d, self.dt, self.d.head_dim // 2
        kind_heads = d.heads if a["kind"] == 0 else d.kv_heads
        end = (kind_heads if a.get("cross") else a["head"] + 1) * half      # pairs it may reach
        pair = torch.arange(a["head"] * half + a["d0"], end)[:a["part"]]            # [n]
        row, local = pair_rows(pair, half)
        y, = self.project(a, self.buf[a["weight"]][row])                   # [B, 2n]: lo, hi
        if a["raw"]:                                 # head_norm_rope finishes the head
            self.buf[a["out"]][:, a["col"] + local] = y
        else:
            self.norm_rope_store(y, a, pair)

    def qkv_part_rope(self, a):
        """K slice s of a q/k/v piece within its head (``qkv_rope``'s pairs): its fp32 product
        into slot s of its kind's partials (columns as the weight's rows); the last slice to take
        the piece's ticket sums the slots, scales each row by its RMS (``sums``) and finishes
        the piece."""
        half = self.d.head_dim // 2
        pair = torch.arange(a["head"] * half + a["d0"], (a["head"] + 1) * half)[:a["part"]]
        row, _ = pair_rows(pair, half)
        k0, k1 = a["s"] * a["ks"], (a["s"] + 1) * a["ks"]
        x, w, part = self.buf[a["x"]], self.buf[a["weight"]], self.buf[a["partial"]]
        part[a["s"]][:, row] = x[:, k0:k1].float() @ w[row, k0:k1].float().T
        if self.last_ticket(a["ticket"], a["slices"]):
            y = part[:, :, row].sum(0)                                           # [B, 2n]
            if a["sums"] is not None:
                y = y * torch.rsqrt(self.buf[a["sums"]].sum(0) / x.shape[-1] + a["eps"])[:, None]
            self.norm_rope_store(y.to(self.dt), a, pair)

    def head_norm_rope(self, a):
        hd = self.d.head_dim
        y = self.buf[a["raw"]][:, a["col"]:a["col"] + hd]                  # [B, D]
        self.norm_rope_store(y, a, a["head"] * (hd // 2) + torch.arange(hd // 2))

    def norm_rope_store(self, y, a, pair):
        """y [B, 2n]: RoPE pairs ``pair`` [n] of the kind's heads laid end to end (lo halves,
        then hi halves)."""
        d, dt, kind, half = self.d, self.dt, a["kind"], self.d.head_dim // 2
        row, local = pair_rows(pair, half)
        pos = self.buf["positions"]
        if kind < 2:
            if a["head_norm"] is not None:                                 # whole heads only
                y = rms(y, self.buf[a["head_norm"]], a["qk_eps"], dt)
            freqs = pos.float()[:, None] * self.buf[a["inv_freq"]][pair % half]
            emb = torch.cat((freqs, freqs), -1)
            cos, sin = emb.cos().to(dt), emb.sin().to(dt)
            n = len(pair)
            rot = torch.cat((-y[:, n:], y[:, :n]), -1)
            y = (y * cos).to(dt) + (rot * sin).to(dt)
        if kind == 0:
            self.buf[a["out"]][:, row] = y
        else:
            rows = torch.arange(d.batch, device=pos.device)[:, None]
            heads = (row // d.head_dim)[None]
            self.buf["kv_cache"][a["layer"], kind - 1, rows, heads, pos[:, None],
                                 local[None]] = y.to(dt)

    def attend(self, b, g, lo, hi, layer, q_name):
        """Row b's query heads of kv head g over its keys [lo, min(hi, length)): unnormalised
        acc [G, D] and (max, sum) [G, 2] in fp32 (max -inf and sum 0 where no key is left)."""
        d = self.d
        group, hd = d.heads // d.kv_heads, d.head_dim
        hi = min(hi, int(self.buf["positions"][b]) + 1)
        q = self.buf[q_name][b].view(d.heads, hd)[g * group:(g + 1) * group].float()
        dev = self.buf["kv_cache"].device
        acc, ml = torch.zeros(group, hd, device=dev), torch.zeros(group, 2, device=dev)
        if lo >= hi:
            ml[:, 0] = float("-inf")
            return acc, ml
        k = self.buf["kv_cache"][layer, 0, b, g, lo:hi].float()
        v = self.buf["kv_cache"][layer, 1, b, g, lo:hi].float()
        scores = q @ k.T * hd ** -0.5                                          # [G, n]
        m = scores.max(-1).values
        p = torch.exp(scores - m[:, None])
        acc.copy_(p.to(self.dt).float() @ v)
        ml[:, 0], ml[:, 1] = m, p.sum(-1)
        return acc, ml

    def attn_out(self, a, b, g, out):
        """Row b's output heads of kv head g: out [G, D] into the task's out [B, HQ * D]."""
        width = self.d.heads // self.d.kv_heads * self.d.head_dim
        self.buf[a["out"]][b, g * width:(g + 1) * width] = out.flatten().to(self.dt)

    def attn_partial(self, a):
        b, g = a["row"], a["kv_head"]
        acc, ml = self.attend(b, g, a["lo"], a["lo"] + a["span"], a["layer"], a["q"])
        if a["direct"]:                              # one split: the output itself
            self.attn_out(a, b, g, acc / ml[:, 1:])
            return
        self.buf[a["acc"]][a["slot"]], self.buf[a["ml"]][a["slot"]] = acc, ml
        if "ticket" in a and self.last_ticket(a["ticket"], a["count"]):
            self.attn_combine(a)                     # fused: the unit's last piece merges

    def attn_pair(self, a):
        for g in range(a["kv_head"], a["kv_head"] + a["heads"]):
            acc, ml = self.attend(a["row"], g, 0, self.d.max_seq_len, a["layer"], a["q"])
            self.attn_out(a, a["row"], g, acc / ml[:, 1:])

    attn_group = attn_pair

    def attn_pair_part(self, a):
        for h in range(2):
            slot, g = a["slot"] + h * a["count"], a["kv_head"] + h
            acc, ml = self.attend(a["row"], g, a["lo"], a["lo"] + a["span"], a["layer"], a["q"])
            self.buf[a["acc"]][slot], self.buf[a["ml"]][slot] = acc, ml
        if "ticket" in a and self.last_ticket(a["ticket"], a["count"]):
            for h in range(2):                       # fused: the pair's last part merges both
                self.attn_combine(a | dict(kv_head=a["kv_head"] + h,
                                           first=a["first"] + h * a["count"]))

    def attn_stream(self, a):
        self.attn_group_stream(a | dict(heads=1, nslots=0))       # units of one kv head

    def attn_group_stream(self, a):
        s, nh, n, slot = self.d.max_seq_len, a["heads"], a["nslots"], a["slot0"]
        per_row = self.d.kv_heads // nh
        for u in range(a["f0"] // s, (a["f1"] - 1) // s + 1):
            lo, hi = max(a["f0"], u * s) - u * s, min(a["f1"], (u + 1) * s) - u * s
            b, g0 = u // per_row, u % per_row * nh
            for h in range(nh):
                acc, ml = self.attend(b, g0 + h, lo, hi, a["layer"], a["q"])
                if hi - lo == s:                     # the whole unit: its heads' outputs
                    self.attn_out(a, b, g0 + h, acc / ml[:, 1:])
                else:                                # a piece: head h's slot of the next one
                    self.buf[a["acc"]][slot + h * n], self.buf[a["ml"]][slot + h * n] = acc, ml
            if hi - lo < s:
                if "merges" in a:                    # fused: the unit's last piece merges it
                    self.merge_cut_unit(a, slot - a["slot0"], b, g0)
                slot += 1

    def merge_cut_unit(self, a, second: int, row: int, kv0: int):
        """A stream's first (``second`` 0) or second cut piece: its unit's ticket, and where it
        is the last, the unit's group combine (``stream_ops.merge_cut_unit``)."""
        first = a["slot0"] + 1 if second else a["first"]
        count = a["count_b"] if second else a["count_a"]
        if self.last_ticket(a["ticket"] + second, count):
            self.attn_group_combine(a | dict(row=row, kv_head=kv0, first=first, count=count))

    attn_pair_stream = attn_group_stream

    def attn_group_combine(self, a):
        for h in range(a["heads"]):
            self.attn_combine(a | dict(kv_head=a["kv_head"] + h,
                                       first=a["first"] + h * a["nslots"]))

    def attn_combine(self, a):
        used = slice(a["first"], a["first"] + a["count"])
        self.attn_out(a, a["row"], a["kv_head"],
                      merge_partials(self.buf[a["acc"]][used], self.buf[a["ml"]][used]))

    def run(self) -> dict:
        tasks, deps, queues = self.c.tasks.tasks, self.c.tasks.deps, self.c.schedule.queues
        done, heads = set(), [0] * len(queues)
        while len(done) < len(tasks):
            progressed = False
            for w, q in enumerate(queues):
                if heads[w] < len(q) and all(d in done for d in deps[q[heads[w]]]):
                    task = tasks[q[heads[w]]]
                    getattr(self, task.kind)(task.args)
                    done.add(task.id)
                    heads[w] += 1
                    progressed = True
            if not progressed:
                raise DeadlockError("reference VM: no worker can run its next task")
        return self.buf


@torch.no_grad()
def run_vm(compiled, model, tokens, positions, kv_cache) -> dict:
    return VM(compiled, model, tokens, positions, kv_cache).run()
