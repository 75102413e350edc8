"""Presenting a ``BenchReport``: a terminal table, a markdown table and a PNG chart."""

from __future__ import annotations

import math
from pathlib import Path

from packer.bench import BASELINE_NAME, READ_PATHS, BenchError, BenchReport

Table = tuple[list[str], list[list[str]], str]  # headers, rows, alignment per column ("l"/"r")


def _mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:,.1f} MB"


def _rate(x: float | None) -> str:
    if x is None or math.isnan(x):
        return "-"
    return f"{x:,.0f}" if x >= 10 else f"{x:.1f}"


def speedup(report: BenchReport, name: str, workers: int) -> float | None:
    """images/s of ``name`` over the baseline's at the same worker count."""
    run, base = report.run(name, workers), report.run(BASELINE_NAME, workers)
    if run is None or base is None or base.images_per_s <= 0:
        return None
    return run.images_per_s / base.images_per_s


def runs_table(report: BenchReport) -> Table:
    has_base = any(d.kind == "baseline" for d in report.datasets)
    headers = [
        "dataset",
        "path",
        "workers",
        "img/s",
        "min-max",
        "MB/s",
        "first batch",
        "peak RSS",
        "peak PSS",
    ]
    if has_base:
        headers.insert(5, "x base")
    rows = []
    for run in report.runs:
        row = [
            run.name,
            run.read_path,
            str(run.workers),
            _rate(run.images_per_s),
            f"{_rate(run.images_per_s_min)}-{_rate(run.images_per_s_max)}",
            f"{run.mb_per_s:,.1f}",
            f"{run.first_batch_s:.2f} s",
            _mb(run.peak_rss_bytes),
            _mb(run.peak_pss_bytes),
        ]
        if has_base:
            ratio = speedup(report, run.name, run.workers)
            row.insert(5, "-" if ratio is None else f"{ratio:.2f}x")
        rows.append(row)
    return headers, rows, "llrrrrrrrr"[: len(headers)]


def datasets_table(report: BenchReport) -> Table:
    headers = ["dataset", "format", "encoding", "samples", "output", "on disk", "bytes/img", "random reads/s"]
    headers.append("decoded reads/s")
    rows = []
    for d in report.datasets:
        access = d.random_access or {}
        rows.append(
            [
                d.name,
                d.format,
                d.encoding,
                str(d.num_samples),
                "x".join(map(str, d.output_size)) if d.output_size else "varies",
                _mb(d.disk_bytes),
                f"{d.bytes_per_image:,.0f}",
                _rate(access.get("bytes_per_s")),
                _rate(access.get("decoded_per_s")),
            ]
        )
    return headers, rows, "lllrrrrrr"


def _text(table: Table) -> str:
    headers, rows, align = table
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, align))

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *map(line, rows)]).rstrip()


def _markdown(table: Table) -> str:
    headers, rows, align = table
    rule = ["---" if a == "l" else "---:" for a in align]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in [headers, rule, *rows])


def _header(report: BenchReport) -> str:
    s = report.settings
    cpus = report.machine.get("cpus")
    training = f"training read RandomResizedCrop({s.augment_size}) + flip, " if s.augment == "rrc" else ""
    return (
        f"batch {s.batch_size}, {s.epochs} timed epoch(s) after 1 warm-up, decode {s.decode}, {training}"
        f"{cpus} CPU(s), torch {report.machine.get('torch')}"
    )


def _footer(report: BenchReport) -> list[str]:
    used = sorted({r.read_path for r in report.runs})
    lines = [f"path {p}: {READ_PATHS[p]}" for p in used]
    lines.append(
        "img/s: median of the timed epochs (persistent workers); MB/s: stored bytes consumed per second; "
        "first batch: from opening the dataset (warm-up epoch); peak RSS/PSS: loader process + DataLoader "
        "workers"
    )
    if report.baseline_preprocess and report.settings.augment == "rrc":
        lines.append("baseline: Pillow decode of the original file, then the same RandomResizedCrop + flip")
    elif report.baseline_preprocess:
        pre = report.baseline_preprocess
        lines.append(
            f"baseline: Pillow decode + resize {pre.get('resize')} ({pre.get('resize_mode')}), "
            f"crop {pre.get('crop')} on the fly, like torchvision's ImageFolder"
        )
    return lines + [f"note: {n}" for n in report.notes]


def _render(report: BenchReport, header: str, table, bullet: str) -> str:
    parts = [header, "", table(runs_table(report)), "", table(datasets_table(report)), ""]
    return "\n".join(parts + [f"{bullet}{line}" for line in _footer(report)])


def format_text(report: BenchReport) -> str:
    return _render(report, f"imgpack bench: {_header(report)}", _text, "")


def format_markdown(report: BenchReport) -> str:
    return _render(report, f"*{_header(report)}*", _markdown, "- ")


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
        runs = [(g, report.run(name, w)) for g, w in enumerate(workers)]
        runs = [(g, run) for g, run in runs if run is not None]
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
                label="ImageFolder + Pillow (baseline)" if g == 0 else None,
                zorder=3,
            )
    ax.set_xticks(range(len(workers)), [f"{w} DataLoader worker{'s' if w != 1 else ''}" for w in workers])
    if log_scale:
        ax.set_yscale("log")
        ax.set_ylim(min(positive) / 2, max(positive) * 4)
    else:
        ax.set_ylim(0, max(positive) * 1.25)
    ax.set_ylabel("images / s, median (whiskers: min-max)" + (", log scale" if log_scale else ""))
    ax.set_title(f"imgpack bench: images/s per dataset and DataLoader workers\n{_header(report)}", fontsize=9)
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


__all__ = ["datasets_table", "format_markdown", "format_text", "plot_report", "runs_table", "speedup"]
