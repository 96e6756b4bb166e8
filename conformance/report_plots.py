"""The plots of a run report's HTML page: matplotlib figures rendered to base64 PNGs.

Only panels with data are drawn: a check report (no throughput) has no speedup panel, a run whose
engine reports no acceptance lengths no histogram; a report with nothing to plot has no plots.
"""

from __future__ import annotations

import base64
import io

__all__ = ["plots"]


_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _interval(sp: dict) -> tuple[float, float, float]:
    """(point, low, high) of a speedup entry: the geometric-mean estimate, or an older report's median."""
    point = sp.get("estimate", sp.get("median"))
    low, high = sp.get("ci_low"), sp.get("ci_high")
    return point, point if low is None else low, point if high is None else high


def plots(report: dict) -> list[tuple[str, str, str]]:
    """(title, caption, base64 PNG) per plot that has data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in report.get("runs", []) if r.get("mode") != "plain"]
    tree = sorted((r for r in runs if r["mode"] == "ddtree"), key=lambda r: r["budget"])
    chain = [r for r in runs if r["mode"] == "dflash"]
    ci = (report.get("bench") or {}).get("ci", "")
    drawn = [
        _tau_plot(plt, runs, tree, chain),
        _speedup_plot(plt, runs, tree, chain, ci),
        _per_position_plot(plt, runs),
        _histogram_plot(plt, runs),
    ]
    return [plot for plot in drawn if plot is not None]


def _budget_axes(ax, tree: list[dict], ylabel: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks([r["budget"] for r in tree])
    ax.set_xticklabels([str(r["budget"]) for r in tree])
    ax.set_xlabel("DDTree budget B (non-root nodes)")
    ax.set_ylabel(ylabel)
    ax.margins(x=0.15)
    ax.grid(True, alpha=0.3)


def _tau_plot(plt, runs: list[dict], tree: list[dict], chain: list[dict]) -> tuple[str, str, str] | None:
    """1. tau vs budget (None: no tree or chain run)."""
    if not (tree or chain):
        return None
    fig, ax = plt.subplots(figsize=(5.4, 3.6))
    if tree:
        ax.plot([r["budget"] for r in tree], [r["tau"] for r in tree], "o-", color=_COLOURS[0], label="DDTree")
        for r in tree:
            ax.annotate(
                f"{r['tau']:.2f}",
                (r["budget"], r["tau"]),
                textcoords="offset points",
                xytext=(0, 7),
                ha="center",
                fontsize=8,
            )
    for r in chain:
        ax.axhline(r["tau"], color=_COLOURS[1], ls="--", label=f"DFlash chain ({r['tau']:.2f})")
    ax.axhline(1.0, color="#888", ls=":", label="plain (1.00)")
    if tree:
        _budget_axes(ax, tree, "tau (tokens per round)")
    else:
        ax.set_ylabel("tau (tokens per round)")
        ax.set_xticks([])
    ax.set_ylim(0, max([r["tau"] for r in runs] + [1.0]) * 1.18)
    ax.legend(fontsize=8, loc="upper left", ncol=3, frameon=False)
    return ("tau vs budget", "Mean acceptance length (pooled over all rounds, bonus included).", _png(fig))


def _speedup_plot(plt, runs: list[dict], tree: list[dict], chain: list[dict], ci: str) -> tuple[str, str, str] | None:
    """2. speedup vs budget, CI error bars (None: no run measured throughput)."""
    measured = [r for r in runs if r.get("speedup")]
    if not measured:
        return None
    fig, ax = plt.subplots(figsize=(5.4, 3.6))
    tree_m = [r for r in tree if r.get("speedup")]
    if tree_m:
        x = [r["budget"] for r in tree_m]
        ivs = [_interval(r["speedup"]) for r in tree_m]
        med = [iv[0] for iv in ivs]
        err = [[iv[0] - iv[1] for iv in ivs], [iv[2] - iv[0] for iv in ivs]]
        ax.errorbar(x, med, yerr=err, fmt="o-", capsize=4, color=_COLOURS[0], label="DDTree (estimate, CI)")
        for xi, m in zip(x, med):
            ax.annotate(f"{m:.2f}x", (xi, m), textcoords="offset points", xytext=(10, 4), fontsize=8)
    for r in chain:
        if r.get("speedup"):
            point, low, high = _interval(r["speedup"])
            ax.axhspan(low, high, color=_COLOURS[1], alpha=0.12, label="DFlash CI")
            ax.axhline(point, color=_COLOURS[1], ls="--", label=f"DFlash chain ({point:.2f}x)")
    ax.axhline(1.0, color="#888", ls=":", label="plain (1.00x)")
    if tree_m:
        _budget_axes(ax, tree, "speedup over plain (x)")
    else:
        ax.set_ylabel("speedup over plain (x)")
        ax.set_xticks([])
    lows = [_interval(r["speedup"])[1] for r in measured] + [1.0]
    highs = [_interval(r["speedup"])[2] for r in measured] + [1.0]
    ax.set_ylim(min(lows) * 0.9, max(highs) * 1.25)
    ax.legend(fontsize=8, loc="upper left", ncol=2, frameon=False)
    caption = "Speedup over plain decoding (tau x plain step time / round time)" + (
        f"; bars and band: {ci}." if ci else "."
    )
    return ("speedup vs budget", caption, _png(fig))


def _per_position_plot(plt, runs: list[dict]) -> tuple[str, str, str] | None:
    """3. per-position acceptance (None: no run reports it)."""
    with_pos = [r for r in runs if r.get("per_position")]
    if not with_pos:
        return None
    fig, ax = plt.subplots(figsize=(5.4, 3.6))
    for i, r in enumerate(with_pos):
        pos = r["per_position"]
        ax.plot(
            range(1, len(pos) + 1),
            pos,
            "o-",
            ms=3,
            color=_COLOURS[i % len(_COLOURS)],
            label=r.get("label") or r["mode"],
        )
    ax.set_xlabel("depth d")
    ax.set_ylabel("fraction of rounds accepting >= d")
    ax.set_ylim(0, 1.02)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return ("per-position acceptance", "Fraction of rounds whose accepted depth reaches d.", _png(fig))


def _histogram_plot(plt, runs: list[dict]) -> tuple[str, str, str] | None:
    """4. histogram of acceptance lengths, fraction of rounds, grouped bars (None: no run reports one)."""
    with_hist = [r for r in runs if r.get("histogram")]
    if not with_hist:
        return None
    fig, ax = plt.subplots(figsize=(5.4, 3.6))
    lengths = sorted({int(k) for r in with_hist for k in r["histogram"]})
    width = 0.8 / len(with_hist)
    for i, r in enumerate(with_hist):
        total = sum(r["histogram"].values())
        ys = [r["histogram"].get(str(n), 0) / total for n in lengths]
        xs = [n - 0.4 + width * (i + 0.5) for n in lengths]
        ax.bar(xs, ys, width=width, color=_COLOURS[i % len(_COLOURS)], label=r.get("label") or r["mode"])
    ax.set_xticks(lengths)
    ax.set_xlabel("acceptance length (accepted + bonus)")
    ax.set_ylabel("fraction of rounds")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return ("acceptance-length histogram", "Distribution of tokens committed per verification round.", _png(fig))
