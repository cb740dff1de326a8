"""Timelines from inside the kernel: per task, when its worker began waiting, when the op began and
when it ended (``%globaltimer`` ns on the GPU, a global tick order under the interpreter).

``trace_step(step)`` reads the stamps of the last launch of a ``MegakernelStep`` built with
``trace=True``; ``kind_table`` sets measured times per op kind beside the cost model's prediction;
``spread_table`` averages the attention tasks' times by batch row, kv head and SM;
``phase_table`` gives each phase of a layer (an op's tasks of one kind, e.g. the o projection's
linear tasks) its span from first start to last end, averaged over the layers, and the counters
its tasks poll; ``tail_table`` says whether a phase ends late for a late input or a slow task
(each task's inputs-ready stamp: ``ready_stamps``);
``critical_path`` walks back from the task that ends last to what held each task up, and
``path_table`` splits that chain by phase into the ops' own time, hops (a task waiting on its
last producer's signal) and dispatch (a task starting after its worker's previous one);
``print_tables`` prints them all; ``draw_timeline`` draws workers against time, waits pale,
ops coloured by kind.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TaskTrace:
    task: int
    kind: str
    worker: int
    wait: int      # stamps relative to the first stamp of the launch
    start: int
    end: int
    sm: int = -1   # the worker's SM (GPU traces of the Triton kernel), else -1


def trace_step(step) -> list[TaskTrace]:
    if not step.trace_mode:
        raise ValueError("this step was built without trace=True")
    step.synchronize()
    n = len(step.owners)
    stamps = step.stamps[1:1 + 3 * n].view(-1, 3).tolist()
    sms = step.stamps[1 + 3 * n:].tolist() if getattr(step, "sm_stamps", False) else []
    tasks = step.compiled.tasks.tasks
    out = [(t, w, *s) for (t, w), s in zip(step.owners, stamps)]
    t0 = min(s[2] for s in out)
    return [TaskTrace(t, tasks[t].kind, w, a - t0, b - t0, c - t0, sms[w] if sms else -1)
            for t, w, a, b, c in out]


def spread_table(traces: list[TaskTrace], compiled, unit_per_us: float) -> dict:
    """The attention tasks' op times (start to end; combines left out), averaged by the batch
    row a task attends for, by its (first) kv head and (GPU traces) by its SM: where a phase's
    slowest tasks sit (on an H100 at 24 and 64 rows the slowest SMs' means were 1.25-1.5 times
    the fastest ones', in groups of SMs, stable over the layers). -> {"by row": {row: us},
    "by kv head": {head: us}, "by SM": {sm: us}} (empty groupings left out)."""
    tasks = compiled.tasks.tasks
    groups: dict[str, dict] = {"by row": defaultdict(list), "by kv head": defaultdict(list),
                               "by SM": defaultdict(list)}
    for t in traces:
        args = tasks[t.task].args
        if t.kind.startswith("attn") and t.kind != "attn_combine" and "row" in args:
            us = (t.end - t.start) / unit_per_us
            groups["by row"][args["row"]].append(us)
            groups["by kv head"][args["kv_head"]].append(us)
            if t.sm >= 0:
                groups["by SM"][t.sm].append(us)
    return {name: {k: sum(v) / len(v) for k, v in sorted(g.items())}
            for name, g in groups.items() if g}


def kind_table(traces: list[TaskTrace], compiled, unit_per_us: float) -> list[dict]:
    """Per op kind: tasks, predicted and measured mean op time, mean wait (in us)."""
    from megakernel.compiler.cost import TARGETS, task_us

    target = TARGETS[compiled.options.target]
    workers = compiled.schedule.num_workers
    rows = defaultdict(lambda: {"tasks": 0, "predicted": 0.0, "measured": 0.0, "waited": 0.0})
    for tr in traces:
        r = rows[tr.kind]
        r["tasks"] += 1
        r["predicted"] += task_us(compiled.tasks.tasks[tr.task], target, workers)
        r["measured"] += (tr.end - tr.start) / unit_per_us
        r["waited"] += (tr.start - tr.wait) / unit_per_us
    return [{"kind": k, "tasks": r["tasks"], "predicted_us": r["predicted"] / r["tasks"],
             "measured_us": r["measured"] / r["tasks"], "waited_us": r["waited"] / r["tasks"]}
            for k, r in sorted(rows.items())]


def op_role(op) -> str:
    """What an op does in its layer: its weight's name without the layer (``o_proj``,
    ``down_proj``, ``lm_head``), else its kind."""
    weight = op.params.get("weight")
    return weight.split(".")[-2] if isinstance(weight, str) and "." in weight else op.kind


def phase_name(role: str, kind: str) -> str:
    """A phase's name: the op's role, then the task kind where it differs (``o_proj linear``)."""
    return f"{role} {kind}" if role != kind else kind


def op_groups(traces: list[TaskTrace], compiled) -> dict[str, list[list[TaskTrace]]]:
    """{phase: its ops' task traces, one list an op}: the tasks of one op and kind grouped, the
    ops of one (op role, task kind) under one phase name, phases and their ops in order of first
    start."""
    ops = {op.name: op for op in compiled.tasks.ops.ops}
    by_op = defaultdict(list)
    for tr in traces:
        by_op[(compiled.tasks.tasks[tr.task].op, tr.kind)].append(tr)
    phases: dict = {}
    for (name, kind), ts in sorted(by_op.items(), key=lambda kv: min(t.start for t in kv[1])):
        phases.setdefault(phase_name(op_role(ops[name]), kind), []).append(ts)
    return phases


def phase_table(traces: list[TaskTrace], compiled, unit_per_us: float) -> list[dict]:
    """Per phase, (op role, task kind) in order of first start: ops (layers), tasks per op, mean
    span from the phase's first start to its last end, mean task time (us), and mean counters
    a task polls (its waits)."""
    rows = []
    for phase, per_op in op_groups(traces, compiled).items():
        ts = [t for op in per_op for t in op]
        span = sum(max(t.end for t in op) - min(t.start for t in op) for op in per_op)
        rows.append({"phase": phase, "ops": len(per_op), "tasks": len(ts) // len(per_op),
                     "span_us": span / len(per_op) / unit_per_us,
                     "task_us": sum(t.end - t.start for t in ts) / len(ts) / unit_per_us,
                     "waits": sum(len(compiled.sync.waits[t.task]) for t in ts) / len(ts)})
    return rows


@dataclass(frozen=True)
class Link:
    trace: TaskTrace
    held_by: str    # "input": the last of the producers of the counters it polls; "queue": its
                    # worker's previous task; "": none (the chain's first task)
    gap: int        # from that task's end stamp to this one's start (end stamps follow the
                    # signal, so a hop can be slightly negative)


def producers_of(compiled) -> dict[int, list[int]]:
    """{counter: the tasks that signal it}."""
    producers = defaultdict(list)
    for task, counter in enumerate(compiled.sync.signal):
        if counter >= 0:
            producers[counter].append(task)
    return producers


def ready_stamps(traces: list[TaskTrace], compiled) -> dict[int, int]:
    """{task: when its inputs were there}: the latest end stamp among the producers of the
    counters it polls (end stamps follow the signal), its wait stamp where it polls none."""
    by_task, producers = {t.task: t for t in traces}, producers_of(compiled)
    return {t.task: max((by_task[p].end for c in compiled.sync.waits[t.task]
                         for p in producers[c]), default=t.wait) for t in traces}


def tail_table(traces: list[TaskTrace], compiled, unit_per_us: float) -> list[dict]:
    """Why each phase ends when it does, per phase (as ``phase_table`` names them), means over
    its ops (us, from the first of its tasks' inputs-ready stamps): the spread of those stamps,
    the tasks' mean and longest op time, and for the task that ends last its inputs' stamp and
    its op time; a late input or a slow task."""
    ready = ready_stamps(traces, compiled)
    keys = ("ready_spread_us", "task_us", "longest_us", "last_ready_us", "last_task_us",
            "end_us")
    rows = []
    for phase, per_op in op_groups(traces, compiled).items():
        sums = [0.0] * len(keys)
        for ts in per_op:
            first, last = min(ready[t.task] for t in ts), max(ts, key=lambda t: t.end)
            op_times = [t.end - t.start for t in ts]
            vals = (max(ready[t.task] for t in ts) - first, sum(op_times) / len(ts),
                    max(op_times), ready[last.task] - first, last.end - last.start,
                    last.end - first)
            sums = [a + b for a, b in zip(sums, vals)]
        rows.append({"phase": phase, **{k: v / len(per_op) / unit_per_us
                                        for k, v in zip(keys, sums)}})
    return rows


def critical_path(traces: list[TaskTrace], compiled) -> list[Link]:
    """The chain of tasks that sets the step's end, first to last: from the task that ends last,
    back through whichever ended later of the last producer among the counters a task polls and
    its worker's previous task."""
    by_task, producers = {t.task: t for t in traces}, producers_of(compiled)
    previous = {b: a for q in compiled.schedule.queues for a, b in zip(q, q[1:])}
    chain = []
    t = max(traces, key=lambda x: x.end)
    while True:
        inputs = [by_task[p] for c in compiled.sync.waits[t.task] for p in producers[c]]
        held = [(max(inputs, key=lambda x: x.end), "input")] if inputs else []
        if t.task in previous:
            held.append((by_task[previous[t.task]], "queue"))
        if not held:
            chain.append(Link(t, "", 0))
            return chain[::-1]
        blocker, why = max(held, key=lambda h: h[0].end)
        chain.append(Link(t, why, t.start - blocker.end))
        t = blocker


def path_table(chain: list[Link], compiled, unit_per_us: float) -> list[dict]:
    """Per phase (as ``phase_table`` names them) in order of first appearance on the chain: its
    tasks there, their op time, the hops before them and the dispatch gaps before them (us)."""
    ops = {op.name: op for op in compiled.tasks.ops.ops}
    rows: dict = {}
    for link in chain:
        t = link.trace
        role = op_role(ops[compiled.tasks.tasks[t.task].op])
        r = rows.setdefault(phase_name(role, t.kind),
                            {"tasks": 0, "op_us": 0.0, "hop_us": 0.0, "dispatch_us": 0.0})
        r["tasks"] += 1
        r["op_us"] += (t.end - t.start) / unit_per_us
        r["hop_us" if link.held_by == "input" else "dispatch_us"] += link.gap / unit_per_us
    return [{"phase": name, **r} for name, r in rows.items()]


def print_tables(traces, compiled, per_us: float, measured: str) -> None:
    """The trace's tables: per op kind, per phase of a layer (spans, then what ends each), and
    the critical path by phase; the attention tasks' times by row, kv head and SM."""
    print(f"{'kind':<14}{'tasks':>7}{'predicted us':>14}{'measured ' + measured:>16}"
          f"{'waited ' + measured:>14}")
    for r in kind_table(traces, compiled, per_us):
        print(f"{r['kind']:<14}{r['tasks']:>7}{r['predicted_us']:>14.2f}{r['measured_us']:>16.2f}"
              f"{r['waited_us']:>14.2f}")
    print(f"\n{'phase (mean over its ops)':<30}{'ops':>5}{'tasks':>7}{'span ' + measured:>14}"
          f"{'task ' + measured:>14}{'waits':>7}")
    for r in phase_table(traces, compiled, per_us):
        print(f"{r['phase']:<30}{r['ops']:>5}{r['tasks']:>7}{r['span_us']:>14.2f}"
              f"{r['task_us']:>14.2f}{r['waits']:>7.2f}")
    print(f"\n{'what ends each phase (mean over its ops)':<42}{'ready':>7}{'task':>7}"
          f"{'longest':>8}{'last: ready':>12}{'task':>7}{'end':>7}   ({measured}, from the"
          " first inputs ready)")
    for r in tail_table(traces, compiled, per_us):
        print(f"{r['phase']:<42}{r['ready_spread_us']:>7.2f}{r['task_us']:>7.2f}"
              f"{r['longest_us']:>8.2f}{r['last_ready_us']:>12.2f}{r['last_task_us']:>7.2f}"
              f"{r['end_us']:>7.2f}")
    chain = critical_path(traces, compiled)
    rows = path_table(chain, compiled, per_us)
    hops = sum(link.held_by == "input" for link in chain)
    print(f"\ncritical path: {len(chain)} tasks, {hops} of them held up by their inputs "
          f"(sums over the step, {measured})")
    print(f"{'phase':<30}{'tasks':>7}{'op':>12}{'hops':>12}{'dispatch':>12}")
    for r in rows + [{"phase": "all", **{k: sum(r[k] for r in rows)
                                         for k in ("tasks", "op_us", "hop_us", "dispatch_us")}}]:
        print(f"{r['phase']:<30}{r['tasks']:>7}{r['op_us']:>12.1f}{r['hop_us']:>12.1f}"
              f"{r['dispatch_us']:>12.1f}")
    for name, means in spread_table(traces, compiled, per_us).items():
        print(f"\nattention tasks, mean {measured} {name}: "
              + " ".join(f"{k}:{v:.1f}" for k, v in means.items()))


def draw_timeline(traces: list[TaskTrace], path: Path, title: str, unit: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({t.kind for t in traces})
    colours = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(kinds)}
    workers = max(t.worker for t in traces) + 1
    fig, ax = plt.subplots(figsize=(14, max(3.0, 0.06 * workers + 2)))
    for k in kinds:
        for t in (t for t in traces if t.kind == k):
            ax.broken_barh([(t.wait, t.start - t.wait)], (t.worker - 0.4, 0.8), color="0.85")
            ax.broken_barh([(t.start, max(t.end - t.start, 1))], (t.worker - 0.4, 0.8),
                           color=colours[k])
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[k]) for k in kinds]
    ax.legend(handles + [plt.Rectangle((0, 0), 1, 1, color="0.85")], kinds + ["waiting"],
              loc="upper right", fontsize=7, ncol=2)
    ax.set_xlabel(unit)
    ax.set_ylabel("worker")
    ax.set_ylim(-0.6, workers - 0.4)
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


LOG_WORDS = 6   # int64 words a wait-log entry (mk::LOG_WORDS)


def wait_entries(words: list, n: int) -> list[dict]:
    """The wait logs' entries from their raw int64 words ([workers * 3 * n * LOG_WORDS], as the
    kernel left them; ``MK_CHUNK_LOG`` n): per worker, lane 0 of consumer warps 0 and NCW - 1 a
    tensor-core chunk each (``stream`` 0 and 1: ``request`` thread 0's ask for x, ``page`` the
    weight page's wait, ``x`` x's wait and the products' issue, ``sync`` the warp's sync,
    ``period`` to the next chunk of the task) and the producer a ring page each (stream 2:
    ``flight`` its wait for a copy in flight to land, ``empty`` for the page to be freed,
    ``period`` to its next page), ns; ``index``: the instruction (or task) the entry is of."""
    out = []
    rows = [words[i:i + LOG_WORDS] for i in range(0, len(words), LOG_WORDS)]
    for w in range(len(rows) // (3 * n)):
        for stream in range(3):
            entries = [e for e in rows[(3 * w + stream) * n:(3 * w + stream + 1) * n] if e[1]]
            for e, nxt in zip(entries, entries[1:] + [None]):
                rec = dict(worker=w, stream=stream, index=e[0] >> 32)
                same = nxt is not None and nxt[0] >> 32 == rec["index"]
                rec["period"] = nxt[1] - e[1] if same else None
                if stream < 2:
                    rec.update(chunk=e[0] & 0xFFFF, chunks=(e[0] >> 16) & 0xFFFF,
                               request=e[2] - e[1], page=e[3] - e[2], x=e[5] - e[3],
                               sync=e[4] - e[5])
                else:
                    rec.update(bytes=e[0] & 0xFFFFFFFF, flight=e[2] - e[1], empty=e[3] - e[2])
                out.append(rec)
    return out


def chunk_log(step) -> list[dict]:
    """The wait logs of a CUDA step's last traced launch (``chunk_log`` knob; ``wait_entries``),
    each entry with its task and the task's kind."""
    n = step.knobs.get("chunk_log", 0)
    if not (step.trace_mode and n):
        raise ValueError("this step was built without trace=True and chunk_log")
    step.synchronize()
    tasks = step.compiled.tasks.tasks
    out = []
    for rec in wait_entries(step.stamps[1 + 3 * len(step.owners):].tolist(), n):
        task = step.owners[rec.pop("index")][0]
        out.append(dict(rec, task=task, kind=tasks[task].kind))
    return out


def chunk_table(log: list[dict]) -> list[dict]:
    """Medians of ``chunk_log``'s waits by (stream, kind): a row each, ns."""
    from statistics import median

    groups = defaultdict(list)
    for rec in log:
        groups[rec["stream"], rec["kind"]].append(rec)
    rows = []
    for (stream, kind), recs in sorted(groups.items()):
        keys = ["request", "page", "x", "sync"] if stream < 2 else ["flight", "empty"]
        row = dict(stream=("warp 0", "warp last", "producer")[stream], kind=kind, n=len(recs))
        for k in keys + ["period"]:
            vals = [r[k] for r in recs if r[k] is not None]
            row[k] = median(vals) if vals else None
        rows.append(row)
    return rows


def chunk_lines(rows: list[dict]) -> list[str]:
    """``chunk_table``'s rows as printed lines: key=value, nanoseconds whole."""
    return ["  ".join(f"{k}={v:.0f}" if isinstance(v, float) else f"{k}={v}"
                      for k, v in row.items()) for row in rows]
