"""Lower: a shaped torch.fx graph of one decode step -> an :class:`OpGraph` of fused ops.

Input: a ``GraphModule`` whose placeholders are ``tokens [B, 1]``, ``positions [B, 1]`` and
``kv_cache [L, 2, B, Hkv, S, D]`` and whose output is logits ``[B, 1, V]`` (what
``capture`` produces from ``megakernel.models``; ``call_module`` Linear/Embedding and their
``F.linear``/``F.embedding`` spellings are both accepted).
Output: ops of six kinds, with these fusions:
    embed         token rows of the embedding table
    qkv_rope      RMSNorm -> Q/K/V projections -> (q/k head RMSNorm) -> RoPE -> KV-cache write
    attention     decode attention over the cache (split over KV length, then combined)
    linear        [RMSNorm ->] projection [-> + residual]  (o_proj + residual, down + residual,
                  final norm + lm_head)
    gate_up       RMSNorm -> gate/up projections -> SiLU(gate) * up
Invariant: every FX node is either consumed by exactly the ops above or is shape bookkeeping; any
other node raises :class:`LoweringError` listing the nodes that matched nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from torch import fx

from .ir import Buffer, Dims, Op, OpGraph


class LoweringError(ValueError):
    pass


def key(n) -> str:
    """One name for ``torch.add``, ``operator.add`` and ``Tensor.add``; module type names."""
    if not isinstance(n, fx.Node):
        return ""
    if n.op == "call_function":
        return getattr(n.target, "__name__", str(n.target))
    if n.op == "call_method":
        return n.target
    if n.op == "call_module":
        return type(n.graph.owning_module.get_submodule(n.target)).__name__
    return n.op


def is_(n, *names) -> bool:
    return key(n) in names


def ancestors(node: fx.Node) -> list[fx.Node]:
    seen, stack = [], [node]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.append(n)
            stack.extend(n.all_input_nodes)
    return seen


@dataclass
class Lowerer:
    gm: fx.GraphModule
    dims: Dims
    ops: list[Op] = field(default_factory=list)
    buffers: dict[str, Buffer] = field(default_factory=dict)
    covered: set = field(default_factory=set)
    memo: dict = field(default_factory=dict)
    layer: int = 0

    # -- helpers -----------------------------------------------------------------------------
    def cover(self, *nodes) -> None:
        self.covered.update(n for n in nodes if isinstance(n, fx.Node))

    def cover_subtree(self, node: fx.Node, allowed_roots=("positions", "kv_cache", "tokens")):
        """Cover an index/mask/RoPE-table expression; it may read only inputs and buffers."""
        stack = [node]
        while stack:
            n = stack.pop()
            if not isinstance(n, fx.Node) or n in self.covered:
                continue
            if n.op == "placeholder" and n.target not in allowed_roots:
                raise LoweringError(f"auxiliary expression {node.name} reads input {n.target}")
            if is_(n, "Linear", "linear", "Embedding", "embedding"):
                raise LoweringError(f"auxiliary expression {node.name} reads activations")
            self.covered.add(n)
            stack.extend(a for a in n.all_input_nodes)

    def param(self, n) -> str:
        """The parameter name behind a get_attr node or a Linear/Embedding module."""
        if isinstance(n, fx.Node) and n.op == "get_attr":
            self.cover(n)
            name = n.target
        elif isinstance(n, str):
            name = n
        else:
            raise LoweringError(f"expected a parameter, got {n}")
        t = self.gm.get_parameter(name) if name in dict(self.gm.named_parameters(remove_duplicate=False)) else None
        if t is None:
            raise LoweringError(f"{name} is not a parameter of the graph module")
        self.buffers.setdefault(name, Buffer(name, "weight", tuple(t.shape)))
        return name

    def linear_parts(self, n):
        """(input node, weight name) of a linear node in either spelling, else None."""
        if is_(n, "Linear"):
            return n.args[0], self.param(f"{n.target}.weight")
        if is_(n, "linear") and len(n.args) >= 2 and n.args[2:] in ((), (None,)):
            return n.args[0], self.param(n.args[1])
        return None

    def new_act(self, name: str, shape) -> str:
        self.buffers[name] = Buffer(name, "act", tuple(shape))
        return name

    # -- patterns ----------------------------------------------------------------------------
    def rmsnorm(self, n):
        """w * (x.float() * rsqrt(x.float().pow(2).mean(-1, keepdim) + eps)).to(dtype)
        -> (x node, weight name, eps), or None."""
        if not is_(n, "mul"):
            return None
        for w, cast in (n.args, n.args[::-1]):
            if not (isinstance(w, fx.Node) and w.op == "get_attr" and is_(cast, "to")):
                continue
            scaled = cast.args[0]
            if not is_(scaled, "mul"):
                continue
            xf, rs = scaled.args
            if not is_(rs, "rsqrt"):
                xf, rs = rs, xf
            if not (is_(rs, "rsqrt") and is_(xf, "float") and is_(rs.args[0], "add")):
                continue
            mean, eps = rs.args[0].args
            if not (is_(mean, "mean") and is_(mean.args[0], "pow") and mean.args[0].args[0] is xf):
                continue
            self.cover(n, cast, scaled, rs, rs.args[0], mean, mean.args[0], xf)
            self.cover(cast.args[1])  # getattr(x, "dtype"): bookkeeping
            return xf.args[0], self.param(w), float(eps)
        return None

    def rope(self, n):
        """x * cos + cat(-x2, x1) * sin -> (x node, inv_freq buffer name), or None."""
        if not is_(n, "add"):
            return None
        a, b = n.args
        if not (is_(a, "mul") and is_(b, "mul") and is_(b.args[0], "cat")):
            return None
        x, cos_u = a.args
        cat, sin_u = b.args
        neg, x1 = cat.args[0]
        if not (is_(neg, "neg") and is_(x1, "getitem") and is_(x1.args[0], "chunk")
                and x1.args[0].args[0] is x):
            return None
        x2 = neg.args[0]
        self.cover(n, a, b, cat, neg, x1, x2, x1.args[0])
        for table in (cos_u, sin_u):
            self.cover_subtree(table)
        inv = [m for m in ancestors(cos_u) if m.op == "get_attr"]
        if len(inv) != 1:
            raise LoweringError(f"RoPE at {n.name} needs one inverse-frequency table, "
                                f"found {[m.target for m in inv]}")
        name = inv[0].target
        buf = getattr(self.gm, name)
        self.buffers[name] = Buffer(name, "f32", tuple(buf.shape))
        return x, name

    def heads(self, n):
        """transpose(unflatten(...)(1, 2)) with optional head RMSNorm in between.
        -> (linear node, head-norm (weight, eps) or None)."""
        if not (is_(n, "transpose") and tuple(n.args[1:]) == (1, 2)):
            raise LoweringError(f"expected per-head transpose at {n.name}")
        self.cover(n)
        inner, norm = n.args[0], None
        matched = self.rmsnorm(inner)
        if matched:
            inner, norm = matched[0], matched[1:]
        if not is_(inner, "unflatten"):
            raise LoweringError(f"expected unflatten into heads at {inner}")
        self.cover(inner)
        return inner.args[0], norm

    # -- activations -------------------------------------------------------------------------
    def act(self, n) -> str:
        """Buffer name of the activation node ``n``; emits the ops that produce it."""
        if n in self.memo:
            return self.memo[n]
        self.cover(n)
        if is_(n, "Embedding", "embedding"):
            out = self.embed(n)
        elif is_(n, "add"):
            out = self.residual_linear(n)
        elif self.linear_parts(n):
            out = self.linear(n, residual=None)
        elif is_(n, "flatten"):
            out = self.attention(n)
        elif is_(n, "mul") and any(is_(a, "silu") for a in n.args):
            out = self.gate_up(n)
        else:
            raise LoweringError(f"node {n.name} ({key(n)}) matches no op of the megakernel")
        self.memo[n] = out
        return out

    def emit(self, kind: str, inputs, outputs, **params) -> None:
        self.ops.append(Op(f"{kind}{len(self.ops)}", kind, tuple(inputs), tuple(outputs), params,
                           layer=self.layer))

    def embed(self, n) -> str:
        if is_(n, "Embedding"):
            table, ids = self.param(f"{n.target}.weight"), n.args[0]
        else:
            ids, table = n.args[0], self.param(n.args[1])
        if not (ids.op == "placeholder" and ids.target == "tokens"):
            raise LoweringError(f"embedding {n.name} must read the tokens input")
        out = self.new_act(f"x_embed{len(self.ops)}", (self.dims.batch, self.dims.hidden))
        self.emit("embed", (table, "tokens"), (out,))
        return out

    def normed_input(self, n):
        """(activation buffer, norm weight, eps) for an RMSNorm output, (buffer, None, 0) else."""
        matched = self.rmsnorm(n)
        if matched:
            x, w, eps = matched
            return self.act(x), w, eps
        return self.act(n), None, 0.0

    def linear(self, n, residual: str | None) -> str:
        x_node, weight = self.linear_parts(n)
        self.cover(n)
        x, norm_w, eps = self.normed_input(x_node)
        n_out = self.buffers[weight].shape[0]
        out = self.new_act(f"y{len(self.ops)}", (self.dims.batch, n_out))
        inputs = [x, weight] + ([norm_w] if norm_w else []) + ([residual] if residual else [])
        self.emit("linear", inputs, (out,), x=x, weight=weight, norm=norm_w, eps=eps,
                  residual=residual)
        return out

    def residual_linear(self, n) -> str:
        a, b = n.args
        if not self.linear_parts(b):
            a, b = b, a
        if not self.linear_parts(b):
            raise LoweringError(f"add {n.name} is not a residual add of a projection")
        return self.linear(b, residual=self.act(a))

    def gate_up(self, n) -> str:
        silu, up = n.args if is_(n.args[0], "silu") else n.args[::-1]
        gate = silu.args[0]
        g_parts, u_parts = self.linear_parts(gate), self.linear_parts(up)
        if not (g_parts and u_parts and g_parts[0] is u_parts[0]):
            raise LoweringError(f"{n.name}: SiLU(gate) * up must share one normed input")
        self.cover(silu, gate, up)
        x, norm_w, eps = self.normed_input(g_parts[0])
        out = self.new_act(f"a{len(self.ops)}", (self.dims.batch, self.dims.intermediate))
        self.emit("gate_up", (x, norm_w, g_parts[1], u_parts[1]), (out,), x=x, norm=norm_w,
                  eps=eps, gate=g_parts[1], up=u_parts[1])
        return out

    def kv_write_for(self, sdpa: fx.Node, layer: int) -> fx.Node:
        """The index_put_ into kv_cache that precedes ``sdpa`` most closely."""
        last = None
        for m in self.gm.graph.nodes:
            if m is sdpa:
                break
            if is_(m, "index_put_") and m.args[0].target == "kv_cache":
                last = m
        if last is None:
            raise LoweringError(f"attention {sdpa.name} reads layer {layer} of the cache, "
                                "but nothing writes the new keys and values first")
        return last

    def projection(self, heads_node):
        lin, head_norm = self.heads(heads_node)
        x_node, weight = self.linear_parts(lin)
        self.cover(lin)
        return x_node, weight, head_norm

    def attention(self, flat) -> str:
        tr = flat.args[0]
        sdpa = tr.args[0] if is_(tr, "transpose") else None
        if not is_(sdpa, "scaled_dot_product_attention"):
            raise LoweringError(f"{flat.name} is not a flattened attention output")
        if sdpa.kwargs.get("scale") is not None or sdpa.kwargs.get("is_causal"):
            raise LoweringError(f"{sdpa.name}: only the default scale with a mask is supported")
        q_node, k_view, v_view = sdpa.args[:3]
        layer = k_view.args[1][0]
        self.layer = layer
        self.cover(tr, sdpa, k_view, v_view)
        self.cover_subtree(sdpa.kwargs["attn_mask"])
        q_heads, inv = self.rope(q_node)
        xq, wq, q_norm = self.projection(q_heads)
        write = self.kv_write_for(sdpa, layer)
        cast = write.args[2]
        stack = cast.args[0] if is_(cast, "to") else cast
        k_rot, v_heads = stack.args[0]
        k_heads, _ = self.rope(k_rot)
        xk, wk, k_norm = self.projection(k_heads)
        xv, wv, _ = self.projection(v_heads)
        if not (xq is xk is xv):
            raise LoweringError(f"{sdpa.name}: q, k and v must project one normed input")
        self.cover(write, cast, stack)
        for index in write.args[1]:
            self.cover_subtree(index)
        x, norm_w, eps = self.normed_input(xq)
        d = self.dims
        q = self.new_act(f"q{len(self.ops)}", (d.batch, d.heads * d.head_dim))
        qk_norms = (q_norm[0], k_norm[0]) if q_norm else ()
        self.emit("qkv_rope", (x, norm_w, wq, wk, wv, *qk_norms, inv, "positions"),
                  (q, "kv_cache"), x=x, norm=norm_w, eps=eps, wq=wq, wk=wk, wv=wv,
                  q_norm=q_norm[0] if q_norm else None, k_norm=k_norm[0] if k_norm else None,
                  qk_eps=q_norm[1] if q_norm else 0.0, inv_freq=inv, layer=layer)
        out = self.new_act(f"attn{len(self.ops)}", (d.batch, d.heads * d.head_dim))
        self.emit("attention", (q, "kv_cache", "positions"), (out,), q=q, layer=layer)
        return out


BOOKKEEPING = {"getattr", "_assert_is_none", "size", "dim"}


def _unmatched(gm: fx.GraphModule, covered: set) -> list[str]:
    rest = []
    for n in gm.graph.nodes:
        if n in covered or n.op in ("placeholder", "output", "get_attr"):
            continue
        if key(n) in BOOKKEEPING or (is_(n, "getitem") and is_(n.args[0], "getattr")):
            continue
        rest.append(f"{n.name} ({key(n)})")
    return rest


def dims_of(gm: fx.GraphModule, itemsize: int) -> Dims:
    """Static sizes from the shaped graph: the cache, the first attention, the first SiLU's
    projection, the embedding table and the output."""
    shapes = {n.target: tuple(n.meta["tensor_meta"].shape) for n in gm.graph.nodes
              if n.op == "placeholder" and "tensor_meta" in n.meta}
    missing = {"tokens", "positions", "kv_cache"} - set(shapes)
    if missing:
        raise LoweringError(f"graph lacks shaped inputs {sorted(missing)} (run ShapeProp first)")
    layers, _, batch, kv_heads, seq, head_dim = shapes["kv_cache"]
    def first(*names):
        node = next((n for n in gm.graph.nodes if is_(n, *names)), None)
        if node is None or "tensor_meta" not in node.meta:
            raise LoweringError(f"graph has no shaped {'/'.join(names)} node")
        return tuple(node.meta["tensor_meta"].shape)
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    return Dims(batch=batch, max_seq_len=seq, hidden=first("Embedding", "embedding")[-1],
                intermediate=first("silu")[-1],
                heads=first("scaled_dot_product_attention")[1], kv_heads=kv_heads,
                head_dim=head_dim, vocab=tuple(out.meta["tensor_meta"].shape)[-1], layers=layers,
                itemsize=itemsize)


def lower(gm: fx.GraphModule, itemsize: int) -> OpGraph:
    dims = dims_of(gm, itemsize)
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    logits = out_node.args[0]
    lw = Lowerer(gm, dims)
    lw.buffers.update({
        "tokens": Buffer("tokens", "input", (dims.batch,)),
        "positions": Buffer("positions", "input", (dims.batch,)),
        "kv_cache": Buffer("kv_cache", "cache", (dims.layers, 2, dims.batch, dims.kv_heads,
                                                 dims.max_seq_len, dims.head_dim)),
    })
    out = lw.act(logits)
    rest = _unmatched(gm, lw.covered)
    if rest:
        raise LoweringError(f"{len(rest)} FX node(s) match no megakernel op: {', '.join(rest[:12])}")
    return OpGraph(dims=dims, buffers=lw.buffers, ops=tuple(lw.ops), output=out)
