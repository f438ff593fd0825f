"""PNG plots of a benchmark run (matplotlib, from the ``bench`` extra; none without it)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.report import Findings

log = logging.getLogger(__name__)


def draw(f: Findings, out_dir: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")  # no screen
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed (pip install .[bench]): no plots")
        return []
    drawn = [_throughput(plt, f, out_dir), _latency(plt, f, out_dir)]
    if f.growth:
        drawn.append(_growth(plt, f, out_dir))
    if f.peer:
        drawn.append(_peer(plt, f, out_dir))
    return [str(p) for p in drawn]


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _throughput(plt: Any, f: Findings, out_dir: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.4, 4))
    xs = [r.plan.concurrency for r in f.sweep]
    ax.plot(xs, [r.rate for r in f.sweep], "o-", label="1 coordinator")
    for r in f.scaling:
        label = f"{r.plan.coordinators} coordinators"
        ax.plot([r.plan.concurrency], [r.rate], "s", markersize=9, label=label)
    ceiling = f.ceiling_msgs_per_s / max(r.messages_per_saga for r in f.sweep)
    ax.axhline(ceiling, linestyle="--", color="grey", label="broker ceiling / msgs per saga")
    ax.set(xscale="log", xlabel="sagas in flight (concurrency)", ylabel="sagas/s",
           title="Throughput versus concurrency")  # fmt: skip
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_ylim(bottom=0)
    ax.legend()
    return _save(plt, fig, out_dir / "throughput.png")


def _latency(plt: Any, f: Findings, out_dir: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.4, 4))
    xs = [r.plan.concurrency for r in f.sweep]
    for p in (50, 95, 99):
        ax.plot(xs, [r.percentile(p) for r in f.sweep], "o-", label=f"p{p}")
    ax.set(xscale="log", yscale="log", xlabel="sagas in flight (concurrency)",
           ylabel="publish to final event, ms", title="Latency percentiles")  # fmt: skip
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.legend()
    return _save(plt, fig, out_dir / "latency.png")


def _growth(plt: Any, f: Findings, out_dir: Path) -> Path:
    fig, (rate_ax, lat_ax) = plt.subplots(1, 2, figsize=(8, 3.6))
    width = 0.38
    xs = list(range(len(f.growth)))
    labels = [f"concurrency {empty.plan.concurrency}" for empty, _ in f.growth]
    stored = f.growth[0][1].plan.preload
    for offset, index, label in ((-width / 2, 0, "empty"), (width / 2, 1, f"{stored:,} stored")):
        runs = [pair[index] for pair in f.growth]
        rate_ax.bar([x + offset for x in xs], [r.rate for r in runs], width, label=label)
        lat_ax.bar([x + offset for x in xs], [r.percentile(50) for r in runs], width, label=label)
    for ax, title, unit in ((rate_ax, "Throughput", "sagas/s"), (lat_ax, "Median latency", "ms")):
        ax.set_xticks(xs, labels)
        ax.set(title=title, ylabel=unit)
    lat_ax.set_yscale("log")
    rate_ax.legend()
    fig.suptitle("Growth: the same database before and after the preload")
    return _save(plt, fig, out_dir / "growth.png")


def _peer(plt: Any, f: Findings, out_dir: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.4, 4))
    cs = [r.plan.concurrency for r in f.ours_refund]
    counts = sorted({p.processes for p in f.peer})
    width = 0.8 / (1 + len(counts))
    xs = list(range(len(cs)))
    ax.bar(xs, [r.rate for r in f.ours_refund], width, label="this stack")
    for i, n in enumerate(counts, start=1):
        theirs = {p.concurrency: p.rate for p in f.peer if p.processes == n}
        ax.bar([x + i * width for x in xs], [theirs.get(c, 0.0) for c in cs], width,
               label=f"{f.peer[0].name}, {n} process{'es' if n > 1 else ''}")  # fmt: skip
    ax.set_xticks(xs, [f"concurrency {c}" for c in cs])
    ax.set(ylabel="sagas/s", title="Refund saga with compensation, same Postgres")
    ax.legend()
    return _save(plt, fig, out_dir / "peer.png")
