"""A ``BenchReport`` as a PNG chart: grouped bars of images/s, the baseline as a reference line."""

from __future__ import annotations

from pathlib import Path

from packer.bench._report import header, speedup
from packer.bench.harness import BenchError
from packer.bench.model import BASELINE_NAME, BenchReport


def plot_report(report: BenchReport, path: str | Path) -> Path:
    """Grouped bars of images/s per dataset per worker count; the baseline as a reference line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BenchError(
            '--plot needs matplotlib; install it with: pip install "imgpack[plot]" (or drop --plot)'
        ) from None
    workers = list(report.settings.workers)
    names = [d.name for d in report.datasets if d.kind != "baseline"]
    width = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(max(7.0, 2.0 + 1.2 * len(workers) * max(1, len(names)) ** 0.5), 5.2))
    values = [r.images_per_s_max for r in report.runs] + [r.images_per_s_min for r in report.runs]
    positive = [v for v in values if v > 0] or [1.0]
    log_scale = max(positive) / min(positive) > 20
    for k, name in enumerate(names):
        found = [(g, report.run(name, w)) for g, w in enumerate(workers)]
        runs = [(g, run) for g, run in found if run is not None]
        xs = [g - 0.4 + width * (k + 0.5) for g, _ in runs]
        heights = [run.images_per_s for _, run in runs]
        spread = [
            [run.images_per_s - run.images_per_s_min for _, run in runs],
            [run.images_per_s_max - run.images_per_s for _, run in runs],
        ]
        ax.bar(xs, heights, width * 0.92, yerr=spread, capsize=3, label=name, ecolor="0.35")
        for x, (_, run) in zip(xs, runs):
            ratio = speedup(report, name, run.workers)
            text = f"{run.images_per_s:,.0f}" + (f"\n{ratio:.1f}x" if ratio is not None else "")
            ax.annotate(
                text,
                (x, run.images_per_s_max),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=7,
            )
    for g, w in enumerate(workers):
        base = report.run(BASELINE_NAME, w)
        if base is not None:
            ax.hlines(
                base.images_per_s,
                g - 0.46,
                g + 0.46,
                colors="black",
                linestyles="--",
                linewidth=1.5,
                label="ImageFolder + Pillow (baseline)" if g == 0 else "_nolegend_",
                zorder=3,
            )
    ax.set_xticks(range(len(workers)), [f"{w} DataLoader worker{'s' if w != 1 else ''}" for w in workers])
    if log_scale:
        ax.set_yscale("log")
        ax.set_ylim(min(positive) / 2, max(positive) * 4)
    else:
        ax.set_ylim(0, max(positive) * 1.25)
    ax.set_ylabel("images / s, median (whiskers: min-max)" + (", log scale" if log_scale else ""))
    ax.set_title(f"imgpack bench: images/s per dataset and DataLoader workers\n{header(report)}", fontsize=9)
    ax.grid(axis="y", alpha=0.3, which="both" if log_scale else "major")
    ax.legend(
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.08),
        ncol=min(3, len(names) + 1),
        frameon=False,
    )
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out
