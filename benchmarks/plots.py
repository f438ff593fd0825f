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
    pairs = []
    for grown in f.growth:
        empty = next((r for r in f.sweep if r.plan.concurrency == grown.plan.concurrency), None)
        if empty is not None:
            pairs += [("empty", empty), (f"{grown.plan.preload:,} stored", grown)]
    labels = [label for label, _ in pairs]
    rate_ax.bar(labels, [r.rate for _, r in pairs], color=["tab:blue", "tab:orange"])
    rate_ax.set(ylabel="sagas/s", title="Throughput")
    lat_ax.bar(labels, [r.percentile(50) for _, r in pairs], color=["tab:blue", "tab:orange"])
    lat_ax.set(ylabel="p50 ms", title="Median latency")
    fig.suptitle(f"Growth (concurrency {f.growth[0].plan.concurrency})")
    return _save(plt, fig, out_dir / "growth.png")


def _peer(plt: Any, f: Findings, out_dir: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.4, 4))
    width = 0.38
    cs = [r.plan.concurrency for r in f.ours_refund]
    theirs = {p.concurrency: p.rate for p in f.peer}
    xs = list(range(len(cs)))
    ax.bar([x - width / 2 for x in xs], [r.rate for r in f.ours_refund], width,
           label="this stack")  # fmt: skip
    ax.bar([x + width / 2 for x in xs], [theirs.get(c, 0.0) for c in cs], width,
           label=f.peer[0].name)  # fmt: skip
    ax.set_xticks(xs, [f"concurrency {c}" for c in cs])
    ax.set(ylabel="sagas/s", title="Refund saga with compensation, same Postgres")
    ax.legend()
    return _save(plt, fig, out_dir / "peer.png")
