"""Pictures for the walkthroughs, drawn with matplotlib from live objects (no network).

- ``draw_graph(graph)``: the compiled agent's nodes and edges, from
  ``agent.graph.get_graph()``, in layers from START to END.
- ``draw_state_machine(transitions)``: the ledger's operation states and every
  allowed move, from ``effectgate.ledger.TRANSITIONS``.
- ``draw_timeline(ledger)``: each operation's states as bars over the ledger's
  event sequence, so every state is visible however short it lasted.

Each returns a PNG as bytes; show it with ``IPython.display.Image(data=...)``.
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Iterable, Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

STATE_COLORS = {
    "PROPOSED": "#bbbbbb",
    "APPROVED": "#8fb3d9",
    "IN_FLIGHT": "#3b75af",
    "UNKNOWN": "#ef8636",
    "NEEDS_RECONCILIATION": "#c53a32",
    "RETRY_WAIT": "#f2cf5b",
    "SUCCEEDED": "#519e3e",
    "FAILED": "#444444",
    "REJECTED": "#8d6ab8",
}
_LIGHT_TEXT = {"IN_FLIGHT", "NEEDS_RECONCILIATION", "SUCCEEDED", "FAILED", "REJECTED"}


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _box(ax, xy, text, color, *, text_color="black", width=1.9, height=0.5):
    x, y = xy
    box = ax.add_patch(
        FancyBboxPatch(
            (x - width / 2, y - height / 2),
            width,
            height,
            boxstyle="round,pad=0.02,rounding_size=0.12",
            facecolor=color,
            edgecolor="#333333",
            linewidth=1,
        )
    )
    ax.text(x, y, text, ha="center", va="center", fontsize=8.5, color=text_color)
    return box


def _arrow(ax, a, b, boxes, *, dashed=False, rad=0.0, color="#333333"):
    """An arrow from box ``a`` to box ``b`` (``boxes``: name -> (center, patch)), clipped at borders."""
    ax.add_patch(
        FancyArrowPatch(
            boxes[a][0],
            boxes[b][0],
            patchA=boxes[a][1],
            patchB=boxes[b][1],
            arrowstyle="-|>",
            mutation_scale=12,
            shrinkA=1,
            shrinkB=1,
            linestyle="--" if dashed else "-",
            connectionstyle=f"arc3,rad={rad}",
            color=color,
            linewidth=1,
        )
    )


def draw_graph(graph) -> bytes:
    """Draw a LangGraph ``Graph`` (``compiled.get_graph()``): boxes in layers, START on top.

    A node's layer is its distance from START along edges that do not lead
    back to an earlier layer; edges back up (the loop to ``agent``) are drawn
    as curves on the side. Conditional edges are dashed.
    """
    nodes = list(graph.nodes)
    edges = [(e.source, e.target, bool(e.conditional)) for e in graph.edges]
    start = next(n for n in nodes if n == "__start__")
    layer = {start: 0}
    frontier = [start]
    while frontier:  # breadth first: the shortest distance from START
        nxt = []
        for node in frontier:
            for src, dst, _ in edges:
                if src == node and dst not in layer:
                    layer[dst] = layer[node] + 1
                    nxt.append(dst)
        frontier = nxt
    if "__end__" in layer:
        layer["__end__"] = max(layer.values()) + 1
    rows: dict[int, list[str]] = defaultdict(list)
    for node in nodes:
        rows[layer.get(node, max(layer.values()) + 1)].append(node)
    pos = {}
    for depth, members in rows.items():
        for i, node in enumerate(sorted(members)):
            pos[node] = ((i - (len(members) - 1) / 2) * 2.3, -depth * 1.2)
    width = max(len(m) for m in rows.values()) * 2.3 + 1.5
    fig, ax = plt.subplots(figsize=(max(6.0, width * 1.05), 1.25 * len(rows) + 0.6))
    boxes = {}
    for node, xy in pos.items():
        label = {"__start__": "START", "__end__": "END"}.get(node, node)
        color = "#e8e8e8" if node.startswith("__") else (
            "#f6d7a7" if node.startswith("effect.") else "#cfe0f3"
        )
        boxes[node] = (xy, _box(ax, xy, label, color))
    for src, dst, conditional in edges:
        back = pos[dst][1] >= pos[src][1]
        color = "#9a9a9a" if back else "#333333"
        _arrow(ax, src, dst, boxes, dashed=conditional, rad=0.12 if back else 0.0, color=color)
    xs = [x for x, _ in pos.values()]
    ys = [y for _, y in pos.values()]
    ax.set_xlim(min(xs) - 1.6, max(xs) + 1.6)
    ax.set_ylim(min(ys) - 0.6, max(ys) + 0.6)
    ax.axis("off")
    ax.set_title("the agent graph (dashed: conditional edges; orange: one node per side effect)")
    fig.tight_layout()
    return _png(fig)


# Where each state sits in the picture (columns left to right follow an operation's life).
_STATE_XY = {
    "PROPOSED": (0.0, 0.0),
    "APPROVED": (2.7, 0.0),
    "IN_FLIGHT": (5.4, 0.0),
    "UNKNOWN": (8.1, 0.0),
    "NEEDS_RECONCILIATION": (10.8, 0.0),
    "RETRY_WAIT": (6.75, 1.9),
    "REJECTED": (1.35, -1.9),
    "FAILED": (6.75, -1.9),
    "SUCCEEDED": (10.8, -1.9),
}


def draw_state_machine(transitions: Mapping[object, Iterable[object]]) -> bytes:
    """Draw every state and every allowed move of ``transitions`` (the ledger's table)."""
    fig, ax = plt.subplots(figsize=(11, 4.6))
    boxes = {}
    for state, xy in _STATE_XY.items():
        text_color = "white" if state in _LIGHT_TEXT else "black"
        boxes[state] = (xy, _box(ax, xy, state, STATE_COLORS[state], text_color=text_color, width=2.2))
    for src, dsts in transitions.items():
        for dst in dsts:
            pair_back = str(src) in [str(d) for d in transitions.get(dst, ())]
            _arrow(ax, str(src), str(dst), boxes, rad=0.2 if pair_back else 0.05, color="#555555")
    ax.set_xlim(-1.3, 12.1)
    ax.set_ylim(-2.4, 2.4)
    ax.axis("off")
    ax.set_title("operation states: every arrow is an entry of effectgate.ledger.TRANSITIONS")
    fig.tight_layout()
    return _png(fig)


def draw_timeline(ledger, *, marks: Mapping[str, int] | None = None) -> bytes:
    """Draw each operation's states as bars over the ledger's event sequence.

    The x axis counts ledger events in commit order, not seconds, so a state
    that lasted a millisecond is as visible as one that waited an hour for a
    person. ``marks`` draws a labelled vertical line before an event number
    (e.g. ``{"kill -9": 7}``).
    """
    events = [e for e in ledger.events() if e.dst is not None]
    order = {e.seq: i for i, e in enumerate(events)}
    ops = sorted(ledger.list(), key=lambda op: (op.thread_id, op.created_at, op.operation_id))
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(ops) + 1.7))
    seen = set()
    for row, op in enumerate(ops):
        mine = [e for e in events if e.operation_id == op.operation_id]
        for e, nxt in zip(mine, [*mine[1:], None], strict=True):
            x0 = order[e.seq]
            x1 = order[nxt.seq] if nxt else len(events)
            state = e.dst.value
            ax.broken_barh(
                [(x0, x1 - x0)],
                (row - 0.35, 0.7),
                facecolor=STATE_COLORS[state],
                edgecolor="white",
                label=None if state in seen else state,
            )
            seen.add(state)
    for label, at in (marks or {}).items():
        ax.axvline(at - 0.02, color="black", linestyle=":", linewidth=1.2)
        ax.text(at, -0.75, f" {label}", fontsize=8, va="bottom")
    ax.set_yticks(range(len(ops)), [f"{op.tool} ({op.thread_id})" for op in ops])
    ax.set_ylim(len(ops) - 0.4, -0.9)
    ax.set_xlim(0, len(events))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("ledger events, in commit order")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=5, fontsize="small")
    ax.set_title("each operation's states, one bar per state")
    fig.tight_layout()
    return _png(fig)
