"""Presenting a ``BenchReport``: a terminal table and a markdown table (the chart: ``plot.py``)."""

from __future__ import annotations

import math

from packer.bench.model import BASELINE_NAME, READ_PATHS, BenchReport

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
    headers += ["decoded reads/s", "classes/batch (i.i.d.)", "top class (i.i.d.)"]
    rows = []
    for d in report.datasets:
        access = d.random_access or {}
        mix = d.read_quality or {}
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
                _pair(mix, "mean_distinct"),
                _pair(mix, "mean_largest_class"),
            ]
        )
    return headers, rows, "lllrrrrrrrr"


def _pair(mix: dict, key: str) -> str:
    """A read-quality figure beside its i.i.d. value (``readers.order.quality``)."""
    return f"{mix[key]:.1f} ({mix['iid_' + key]:.1f})" if mix else "-"


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


def header(report: BenchReport) -> str:
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
    lines += window_gains(report)
    return lines + [f"note: {n}" for n in report.notes]


WHOLE = " (whole decode)"


def window_gains(report: BenchReport) -> list[str]:
    """One line per packed JPEG row read both ways: decoding only the crop window vs whole."""
    lines = []
    for whole in report.runs:
        if not whole.name.endswith(WHOLE) or whole.images_per_s <= 0:
            continue
        windowed = report.run(whole.name[: -len(WHOLE)], whole.workers)
        if windowed is not None:
            lines.append(
                f"decode only the crop window: {windowed.name}, {whole.workers} worker(s): "
                f"{windowed.images_per_s / whole.images_per_s:.2f}x the whole decode"
            )
    return lines


def _render(report: BenchReport, header: str, table, bullet: str) -> str:
    parts = [header, "", table(runs_table(report)), "", table(datasets_table(report)), ""]
    return "\n".join(parts + [f"{bullet}{line}" for line in _footer(report)])


def format_text(report: BenchReport) -> str:
    return _render(report, f"imgpack bench: {header(report)}", _text, "")


def format_markdown(report: BenchReport) -> str:
    return _render(report, f"*{header(report)}*", _markdown, "- ")


__all__ = ["datasets_table", "format_markdown", "format_text", "header", "runs_table", "speedup"]
