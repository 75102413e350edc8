"""``pack bench --cold`` and ``--memory-cap``: epochs that come from the disk, against warm ones.

For each dataset, round and read-ahead setting: a warm-up epoch (which fills the page cache),
then a timed warm epoch, then the dataset is dropped from the cache (its own files, or with
``drop_caches`` the whole cache) and a timed cold epoch follows, on the same epoch's order. Every
epoch runs in a fresh process (``packer.bench.cold_epoch``): pages a live process has mapped are
not dropped. With ``memory_cap`` the cold epoch's process tree runs in a memory cgroup of that
size (choose it a third of the dataset or less), so the cache cannot hold what it reads. The
settings alternate their order from round to round, so a drift of the machine's load hits both;
the figure is the median over rounds of each round's cold/warm ratio.

Peers read the same images under the same conditions: ``webdataset`` a tar dataset's own shards,
``ffcv`` a ``.beton`` of the dataset's stored bytes (``packer.bench._ffcv_peer``) with FFCV's
Python. What a peer reads from the disk is what is evicted before its cold epoch and what its
bytes per image (the ceiling, dataset / cap) are counted from: the ``.beton``, for FFCV.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from packer.bench import _ffcv_peer
from packer.bench.harness import BenchError, code_env, folder_bytes, machine_info, run_measured
from packer.bench.pagecache import (
    MemoryCap,
    dataset_resident,
    device_read_bytes,
    drop_all_caches,
    evict,
    read_sequentially,
)
from readers.errors import OptionError
from readers.remote.readahead import resolve_budget
from readers.store.manifest import read_manifest

DAMON = Path("/sys/kernel/mm/damon/admin/kdamonds")


@dataclass(frozen=True)
class ColdSettings:
    workers: int = 2
    batch_size: int = 64
    rounds: int = 3
    readahead: tuple[int, ...] = (0, resolve_budget(None))
    records_only: bool = False
    crop: int = 224
    drop_caches: bool = False
    memory_cap: int | None = None
    peers: tuple[str, ...] = ()  # read the datasets with these too: webdataset (tar), ffcv
    ffcv_python: str = _ffcv_peer.DEFAULT_PYTHON
    peer_dir: str | None = None  # where a peer's own copy (FFCV's .beton) lives; None: beside the dataset
    ffcv_page_size: int = _ffcv_peer.DEFAULT_PAGE_SIZE  # the .beton's pages: what FFCV holds per page read
    seed: int = 0
    timeout: float = 900


def epoch_command(
    path: str,
    settings: ColdSettings,
    readahead: int,
    epoch: int,
    peer: str = "",
    beton: _ffcv_peer.Beton | None = None,
) -> list[str]:
    """The command line of one epoch of ``path``, by imgpack or by ``peer`` (``ffcv``: of
    ``beton``, by FFCV's Python)."""
    if peer == "ffcv":
        if beton is None:
            raise BenchError(f"{path}: the ffcv peer reads a .beton and none was given")
        s = settings
        return _ffcv_peer.read_command(s.ffcv_python, beton, s.workers, s.batch_size, s.crop, s.seed, epoch)
    args = {
        "path": path,
        "peer": peer,
        "workers": settings.workers,
        "batch_size": settings.batch_size,
        "readahead": readahead,
        "records_only": settings.records_only,
        "crop": settings.crop,
        "epoch": epoch,
        "seed": settings.seed,
    }
    return [sys.executable, "-m", "packer.bench.cold_epoch", json.dumps(args)]


def run_epoch(
    path: str,
    settings: ColdSettings,
    readahead: int,
    epoch: int,
    cap: MemoryCap | None = None,
    peer: str = "",
    beton: _ffcv_peer.Beton | None = None,
) -> dict:
    """One epoch of ``path`` in a fresh process (in ``cap``'s cgroup if given), by imgpack or by
    ``peer``: its figures."""
    cmd = epoch_command(path, settings, readahead, epoch, peer, beton)
    env = code_env()  # this checkout's packer and readers (FFCV's Python runs its child from it too)
    with AnonymousPeak(cap) as anonymous:
        join = cap.join if cap is not None else None
        try:
            # resident sets only, seldom: PSS sampling slowed a 1.7 GB FFCV process several times over
            measured = run_measured(
                cmd, interval=0.5, check=False, timeout=settings.timeout, pss=False, env=env, preexec_fn=join
            )
        except TimeoutError:
            who = f"{path} by {peer}" if peer else path
            raise BenchError(
                f"{who}: an epoch ran past {settings.timeout:g} s and was stopped; give a larger "
                "--epoch-timeout (or a smaller dataset)"
            ) from None
    if measured.returncode:
        killed = f" (killed: {cap.events()})" if cap is not None else ""
        tail = measured.stderr.strip().splitlines()[-3:]
        who = f"{path} by {peer}" if peer else path
        raise BenchError(f"{who}: epoch process exited {measured.returncode}{killed}: {' / '.join(tail)}")
    result = json.loads(measured.stdout.strip().splitlines()[-1])
    result["epoch_rate"] = result["images"] / result["seconds"]
    result["rate"] = steady_rate(result)
    result["peak_rss_bytes"] = measured.peak_rss_bytes
    result["peak_anonymous_bytes"] = anonymous.peak
    return result


def steady_rate(result: dict) -> float:
    """Images/s after an epoch's first batch: the pace a long run reads at, without the start of
    the fresh process each epoch runs in (workers, FFCV's pipeline compilation: seconds, paid once
    in a training run, here once per epoch); the whole epoch's where it has a single batch."""
    rest = result["images"] - result.get("first_batch_images", result["images"])
    span = result["seconds"] - result.get("first_batch_s", 0.0)
    return rest / span if rest > 0 and span > 0 else result["images"] / result["seconds"]


class AnonymousPeak:
    """The most anonymous memory ``cap``'s cgroup held while the block ran, sampled every 50 ms:
    what the reading tree needs for itself, which a cap must leave room for besides the cache."""

    def __init__(self, cap: MemoryCap | None, interval: float = 0.05):
        self.cap, self.interval = cap, interval
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        assert self.cap is not None
        while not self._stop.wait(self.interval):
            now = self.cap.anonymous()
            if now is not None:
                self.peak = max(self.peak or 0, now)

    def __enter__(self) -> AnonymousPeak:
        if self.cap is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.cap is not None:
            self._stop.set()
            self._thread.join()


def damon_state() -> str:
    """Whether a DAMON page-out scheme runs (it evicts idle page cache: warm figures may read some
    pages from the disk); "" where DAMON is absent."""
    try:
        states = [(d / "state").read_text().strip() for d in DAMON.iterdir() if d.name.isdigit()]
        actions = [a.read_text().strip() for a in DAMON.glob("*/contexts/*/schemes/*/action")]
    except OSError:
        return ""
    return f"kdamonds {','.join(states) or 'none'}; schemes {','.join(actions) or 'none'}"


def peer_name(peer: str, settings: ColdSettings) -> str:
    """A peer's name in the table: FFCV's with its page size where it is not FFCV's default."""
    if peer == "ffcv" and settings.ffcv_page_size != _ffcv_peer.DEFAULT_PAGE_SIZE:
        return f"ffcv, {settings.ffcv_page_size >> 20} MiB pages"
    return peer


def disk_rate(path: str) -> float:
    """The disk's sequential read rate in bytes/s, reading ``path``'s files after evicting them."""
    evict(path)
    total, seconds = read_sequentially(path)
    evict(path)
    return total / seconds if seconds > 0 else float("nan")


def run_cold(datasets: list[str], settings: ColdSettings, log: Callable[[str], None] | None = None) -> dict:
    say = log or (lambda message: None)
    conditions: dict[str, Any] = {**machine_info(), "settings": asdict(settings), "damon": damon_state()}
    conditions["disk_bytes_per_s"] = disk_rate(datasets[0])
    say(f"disk: {conditions['disk_bytes_per_s'] / 1e6:.0f} MB/s sequential ({datasets[0]})")
    rows = []
    for path in datasets:
        manifest = read_manifest(path)
        size = folder_bytes(path)
        readers = [("", r) for r in settings.readahead]
        readers += [(peer, 0) for peer in settings.peers if peer != "webdataset" or manifest.format == "tar"]
        beton = None
        if "ffcv" in settings.peers:
            python, workers = settings.ffcv_python, settings.workers
            pages = settings.ffcv_page_size
            beton = _ffcv_peer.ensure_beton(path, settings.peer_dir, python, workers, say, pages)
        cap = None
        if settings.memory_cap is not None:
            cap = MemoryCap(settings.memory_cap)
        try:
            for rnd in range(settings.rounds):
                for peer, readahead in readers if rnd % 2 == 0 else readers[::-1]:
                    fmt = f"{peer_name(peer, settings)} ({manifest.format})" if peer else manifest.format
                    own = beton if peer == "ffcv" else None
                    rows.append(_one_round(path, fmt, size, settings, readahead, rnd, cap, say, peer, own))
        finally:
            if cap is not None:
                cap.remove()
    return {"conditions": conditions, "rows": rows, "summary": summarize(rows, conditions)}


def _one_round(
    path: str,
    fmt: str,
    size: int,
    settings: ColdSettings,
    readahead: int,
    rnd: int,
    cap: MemoryCap | None,
    say: Callable[[str], None],
    peer: str = "",
    beton: _ffcv_peer.Beton | None = None,
) -> dict:
    """One round of one reader: warm-up, warm, evict, cold. What it reads from the disk is the
    dataset's files, or the peer's own copy (``beton``): that is evicted and its bytes counted."""
    source, size = (str(beton.path), beton.bytes) if beton is not None else (path, size)
    run_epoch(path, settings, readahead, rnd, peer=peer, beton=beton)  # fills the cache
    resident_warm = dataset_resident(source)
    warm = run_epoch(path, settings, readahead, rnd, peer=peer, beton=beton)
    if settings.drop_caches:
        drop_all_caches()
    else:
        evict(source)
    resident_cold = dataset_resident(source)
    read_before = device_read_bytes(source)
    cold = run_epoch(path, settings, readahead, rnd, cap, peer, beton)
    read_after = device_read_bytes(source)
    row = {
        "dataset": path,
        "read": source,
        "format": fmt,
        "bytes": size,
        "round": rnd,
        "readahead": readahead,
        "warm": warm["rate"],
        "cold": cold["rate"],
        "ratio": cold["rate"] / warm["rate"],
        "resident_before_warm": resident_warm,
        "resident_before_cold": resident_cold,
        "hinted_bytes": cold["hinted_bytes"],
        "peer": peer,
        "cold_peak_rss_bytes": cold["peak_rss_bytes"],
        "images": cold["images"],
        "cold_disk_read": _read_ratio(read_before, read_after, size),
        "warm_epoch": warm["epoch_rate"],  # the whole epoch, its start included
        "cold_epoch": cold["epoch_rate"],
        "warm_first_batch_s": warm["first_batch_s"],
        "cold_first_batch_s": cold["first_batch_s"],
    }
    if cap is not None:
        row["cap_bytes"], row["cap_peak_bytes"] = cap.limit, cap.peak()
        row["cap_peak_anonymous_bytes"] = cold["peak_anonymous_bytes"]
    kind = "capped" if cap else "cold"
    say(
        f"{path}{' by ' + peer if peer else ''} round {rnd} readahead {readahead}: "
        f"warm {row['warm']:.0f} img/s, {kind} {row['cold']:.0f} img/s, ratio {row['ratio']:.2f} "
        f"(cached before warm {resident_warm:.2f}, before cold {resident_cold:.2f}; first batch "
        f"warm {warm['first_batch_s']:.2f} s, {kind} {cold['first_batch_s']:.2f} s"
        + (f"; disk read {row['cold_disk_read']:.2f}x its bytes" if row["cold_disk_read"] is not None else "")
        + ")"
    )
    return row


def summarize(rows: list[dict], conditions: dict) -> list[dict]:
    """Per (dataset, reader, read-ahead): the rounds' ratios, their median, the median rates and,
    against the disk, the ceiling ``min(warm rate, disk rate / bytes per image)``, the bytes being
    those the reader reads from the disk (its rows' ``bytes``: a peer's own copy, for FFCV)."""
    out = []
    both = ("warm", "cold")
    keys = dict.fromkeys((r["dataset"], r["peer"], r["readahead"]) for r in rows)
    for dataset, peer, readahead in keys:
        key = (dataset, peer, readahead)
        mine = [r for r in rows if (r["dataset"], r["peer"], r["readahead"]) == key]
        warm = statistics.median(r["warm"] for r in mine)
        per_image = mine[0]["bytes"] / max(1, mine[0]["images"])
        ceiling = min(warm, conditions["disk_bytes_per_s"] / per_image)
        cold = statistics.median(r["cold"] for r in mine)
        out.append(
            {
                "dataset": dataset,
                "format": mine[0]["format"],
                "peer": peer,
                "readahead": readahead,
                "ratios": [round(r["ratio"], 2) for r in mine],
                "ratio": statistics.median(r["ratio"] for r in mine),
                "warm": warm,
                "cold": cold,
                "of_ceiling": cold / ceiling,
                "bytes": mine[0]["bytes"],
                "first_batch_s": [statistics.median(r[f"{k}_first_batch_s"] for r in mine) for k in both],
                "tree_anonymous_bytes": max(r.get("cap_peak_anonymous_bytes") or 0 for r in mine),
                "disk_read": _median_or_none([r.get("cold_disk_read") for r in mine]),
            }
        )
    return out


def _read_ratio(before: int | None, after: int | None, size: int) -> float | None:
    """What the disk read between ``before`` and ``after``, in the reader's bytes (> 1: pages
    read twice, evicted before their last use)."""
    return None if before is None or after is None or not size else (after - before) / size


def _median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def format_cold(report: dict) -> str:
    """A markdown table of the summary, with the conditions under it."""
    capped = report["conditions"]["settings"]["memory_cap"]
    kind = "capped" if capped else "cold"
    extra = " dataset / cap | tree's own memory |" if capped else ""
    lines = [
        f"| format | readahead | warm img/s | {kind} img/s | {kind} / warm (rounds) | median | of ceiling | "
        f"first batch s, warm / {kind} | disk read / bytes |" + extra,
        "|---|---:|---:|---:|---|---:|---:|---:|---:|" + ("---:|---:|" if capped else ""),
    ]
    for s in report["summary"]:
        ratios = ", ".join(f"{r:.2f}" for r in s["ratios"])
        ahead = "its own" if s["peer"] else f"{s['readahead'] >> 20} MiB"
        first, then = s["first_batch_s"]
        read_x = "" if s.get("disk_read") is None else f"{s['disk_read']:.2f}x"
        cells = f" {s['bytes'] / capped:.1f}x | {s['tree_anonymous_bytes'] >> 20} MiB |" if capped else ""
        lines.append(
            f"| {s['format']} | {ahead} | {s['warm']:.0f} | {s['cold']:.0f} | {ratios} | "
            f"**{s['ratio']:.2f}** | {s['of_ceiling']:.2f} | {first:.2f} / {then:.2f} | {read_x} |{cells}"
        )
    c = report["conditions"]
    st = c["settings"]
    read = "records only (no decode)" if st["records_only"] else f"decoded, centre crop {st['crop']}"
    lines.append("")
    lines.append(
        f"{read}, batch {st['batch_size']}, {st['workers']} workers, {st['rounds']} rounds; img/s "
        "after each epoch's first batch (each epoch is a fresh process); disk "
        f"{c['disk_bytes_per_s'] / 1e6:.0f} MB/s sequential; load average at start "
        f"{c['load_average_at_start']}; {c['cpus']} CPUs"
        + (f"; memory cap {capped >> 20} MiB" if capped else "")
        + (f"; DAMON: {c['damon']}" if c["damon"] else "")
    )
    return "\n".join(lines)


def cold_command(
    datasets: list[str],
    workers: tuple[int, ...],
    batch_size: int,
    memory_cap: str | None,
    records_only: bool,
    drop_caches: bool,
    rounds: int,
    crop: int,
    seed: int,
    json_path: str | None,
    quiet: bool,
    readahead: str = "0,16M",
    peers: tuple[str, ...] = (),
    ffcv_python: str = _ffcv_peer.DEFAULT_PYTHON,
    peer_dir: str | None = None,
    ffcv_page_size: str = "8M",
    epoch_timeout: float = 900,
) -> None:
    """``pack bench --cold`` / ``--memory-cap``: run, print the table, write the JSON."""
    import signal

    import click

    # SIGTERM stops like Ctrl-C: the running epoch is killed and the memory cgroup removed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    from readers.remote.readahead import parse_bytes

    for path in datasets:
        if not Path(path).is_dir():
            raise click.BadParameter(
                f"{path}: --cold and --memory-cap read local packed datasets (a directory)"
            )
    if peers and records_only:
        raise click.BadParameter("a peer decodes what it reads: drop --records-only", param_hint="--peer")
    if "webdataset" in peers and not any(read_manifest(path).format == "tar" for path in datasets):
        raise click.BadParameter("webdataset reads tar shards: name a tar dataset too", param_hint="--peer")
    if "ffcv" in peers:
        for path in datasets:
            folder = _ffcv_peer.peer_folder(path, peer_dir).resolve()
            if folder.is_relative_to(Path(path).resolve()):
                raise click.BadParameter(
                    f"{folder} lies inside the dataset {path}: name a folder outside it",
                    param_hint="--peer-dir",
                )
        problem = _ffcv_peer.python_problem(ffcv_python)
        if problem:
            raise click.BadParameter(problem, param_hint="--ffcv-python")
    try:
        pages = parse_bytes(ffcv_page_size, "--ffcv-page-size")
    except OptionError as exc:
        raise click.BadParameter(str(exc), param_hint="--ffcv-page-size") from None
    problem = _ffcv_peer.page_size_problem(pages)
    if problem:
        raise click.BadParameter(problem, param_hint="--ffcv-page-size")
    cap = parse_bytes(memory_cap, "--memory-cap") if memory_cap else None
    try:
        budgets = tuple(
            dict.fromkeys(parse_bytes(b, "--readahead") for b in readahead.split(",") if b.strip())
        )
    except OptionError as exc:
        raise click.BadParameter(str(exc), param_hint="--readahead") from None
    settings = ColdSettings(
        workers=workers[-1], batch_size=batch_size, rounds=rounds, records_only=records_only, crop=crop,
        drop_caches=drop_caches, memory_cap=cap, seed=seed, readahead=budgets or (0,), peers=peers,
        ffcv_python=ffcv_python, peer_dir=peer_dir, ffcv_page_size=pages, timeout=epoch_timeout,
    )  # fmt: skip
    log = None if quiet else (lambda message: click.echo(message, err=True))
    try:
        report = run_cold(datasets, settings, log)
    except BenchError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(format_cold(report))
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
