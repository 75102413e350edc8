"""`pack bench`: real measurements on sample_data (tiny epochs), their outputs and the CLI."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from packer.bench._plot import plot_report
from packer.bench._report import format_markdown, format_text
from packer.bench.baseline import ImageFolderBaseline
from packer.bench.harness import BenchError, MemorySampler, run_measured, take_turns, time_epochs
from packer.bench.model import BASELINE_NAME, BenchReport, Settings
from packer.bench.run import run_bench
from packer.cli import main
from readers import open_dataset
from readers.store.manifest import read_manifest
from tests.conftest import REPO, SAMPLE_DATA, packed_items, run_cli

pytestmark = pytest.mark.slow  # runs pack bench

FIXED = {"resize": 64, "crop": 56}  # every image 56x56: the batch path
HAS_DALI_MODULE = importlib.util.find_spec("readers.dali") is not None


@pytest.fixture(scope="module")
def fixed_ds(packed):
    return packed("lmdb", **FIXED)


@pytest.fixture(scope="module")
def report(fixed_ds) -> BenchReport:
    settings = Settings(workers=(0, 2), batch_size=16, epochs=1, random_reads=16)
    return run_bench([fixed_ds], baseline=str(SAMPLE_DATA), settings=settings)


def test_every_run_reads_epochs_times_dataset_size(report, fixed_ds):
    n = read_manifest(fixed_ds).num_samples
    assert [(r.name, r.workers) for r in report.runs] == [
        (BASELINE_NAME, 0),
        (BASELINE_NAME, 2),
        ("lmdb:ds", 0),
        ("lmdb:ds", 2),
    ]
    for run in report.runs:
        assert run.samples_per_epoch == n
        assert run.images == report.settings.epochs * n
        assert len(run.epoch_seconds) == report.settings.epochs
        assert all(s > 0 for s in run.epoch_seconds)
    # the baseline reads exactly as many samples as the packed dataset
    counts = {d.name: d.num_samples for d in report.datasets}
    assert counts == {BASELINE_NAME: n, "lmdb:ds": n}


def test_figures_are_positive_and_consistent(report):
    infos = {d.name: d for d in report.datasets}
    for run in report.runs:
        info = infos[run.name]
        assert 0 < run.images_per_s_min <= run.images_per_s <= run.images_per_s_max
        assert run.images_per_s == pytest.approx(run.images / sum(run.epoch_seconds))  # one timed epoch
        assert run.mb_per_s == pytest.approx(run.images_per_s * info.bytes_per_image / 1e6)
        assert 0 < run.first_batch_s < 60
        assert run.peak_rss_bytes >= run.idle_rss_bytes > 0
        assert run.peak_pss_bytes is None or 0 < run.peak_pss_bytes <= run.peak_rss_bytes
    for info in infos.values():
        assert info.disk_bytes > 0
        assert info.bytes_per_image == pytest.approx(info.disk_bytes / info.num_samples)
        access = info.random_access
        assert access["reads"] == 16 and access["bytes_per_s"] > 0 and access["decoded_per_s"] > 0
    # paths: the packed data (one size) assembles batches in workers; the baseline collates samples
    assert infos["lmdb:ds"].read_path == "batch" and infos["lmdb:ds"].output_size == [56, 56]
    assert infos[BASELINE_NAME].read_path == "sample+stack"
    assert infos[BASELINE_NAME].disk_bytes == sum(
        p.stat().st_size for p in SAMPLE_DATA.rglob("*.*") if p.suffix.lower() in (".jpg", ".png")
    )


# A parent that forks two children, each holding 64 MiB of its own for a second.
FORKING_TREE = """
import os, time
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        held = bytearray(64 << 20)
        for i in range(0, len(held), 4096):
            held[i] = 1
        time.sleep(1.0)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
"""


def test_workers_show_up_in_peak_memory():
    # Forked children add their own pages to the process tree's peak (the bench's 44-sample runs
    # end their workers within a few samples: on a loaded machine the sampler could miss them).
    alone = run_measured([sys.executable, "-c", "import time; time.sleep(0.3)"])
    tree = run_measured([sys.executable, "-c", FORKING_TREE])
    assert tree.peak_rss_bytes > alone.peak_rss_bytes + 2 * (60 << 20)
    assert tree.peak_pss_bytes is None or tree.peak_pss_bytes > 2 * (60 << 20)


def test_json_markdown_text_and_png(report, tmp_path):
    data = json.loads(json.dumps(report.to_dict()))
    again = BenchReport.from_dict(data)
    assert again.runs == report.runs and again.datasets == report.datasets
    assert data["machine"]["cpus"] >= 1 and set(data["read_paths"]) >= {"batch", "sample+stack"}

    text = format_text(report)
    assert "lmdb:ds" in text and BASELINE_NAME in text and "path batch:" in text
    markdown = format_markdown(report)
    tables = [line for line in markdown.splitlines() if line.startswith("|")]
    assert tables[0].startswith("| dataset | path | workers | img/s")
    assert len(tables) == 2 + len(report.runs) + 2 + len(report.datasets)
    assert len({line.count("|") for line in tables[: 2 + len(report.runs)]}) == 1  # same column count

    png = plot_report(report, tmp_path / "bench.png")
    with Image.open(png) as img:
        assert img.format == "PNG" and img.width >= 600 and img.height >= 400
        # not a blank canvas: bars and text draw many distinct colours
        assert len(img.convert("RGB").getcolors(1 << 20)) > 20


def test_baseline_gives_the_packed_output(fixed_ds):
    ds = open_dataset(fixed_ds, decode="numpy")
    base = ImageFolderBaseline(SAMPLE_DATA, read_manifest(fixed_ds).preprocess, decode="numpy")
    assert len(base) == len(ds) and base.classes == ds.classes
    diffs = []
    at = {path: j for j, (path, _) in enumerate(base.samples)}  # the pack is shuffled, the folder not
    for i, item in enumerate(packed_items(fixed_ds)):
        packed_img, packed_label = ds[i]
        base_img, base_label = base[at[item.path]]
        assert base_label == packed_label
        assert base_img.shape == packed_img.shape == (56, 56, 3)
        diffs.append(np.abs(base_img.astype(np.int16) - packed_img.astype(np.int16)).mean())
    # Same resize and centre crop: only JPEG re-encoding and DCT-domain downscaling differ (a
    # different crop or aspect gives ~30). Single files may differ more (EXIF rotation, alpha
    # dropped rather than flattened on white), as they do with torchvision's ImageFolder.
    assert np.median(diffs) < 8, diffs


ALLOCATE = "import time; x = bytearray(300_000_000); x[::4096] = b'1' * len(x[::4096]); time.sleep(0.5)"


def test_memory_sampler_counts_child_processes():
    with MemorySampler(interval=0.01) as sampler:
        own = sampler.process.memory_info().rss
        subprocess.run([sys.executable, "-c", ALLOCATE], check=True)
    assert sampler.peak_rss >= own + 250_000_000


def test_run_measured_samples_the_command_tree_from_outside():
    # the command's child allocates: the tree, not only the command's own process, is sampled
    spawn = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {ALLOCATE!r}], check=True)"
    run = run_measured([sys.executable, "-c", spawn], interval=0.01)
    assert run.returncode == 0 and run.seconds >= 0.5
    assert run.peak_rss_bytes >= 250_000_000
    assert run.peak_pss_bytes is None or 250_000_000 <= run.peak_pss_bytes <= run.peak_rss_bytes
    with pytest.raises(BenchError, match="exit 3"):
        run_measured([sys.executable, "-c", "import sys; sys.exit(3)"])
    light = run_measured([sys.executable, "-c", spawn], interval=0.01, pss=False)  # resident sets only
    assert light.peak_rss_bytes >= 250_000_000 and light.peak_pss_bytes is None


def test_epoch_timer_counts_batches_and_takes_turns():
    times = time_epochs([(None, [0, 1, 2]), (None, [3])], epochs=2, warmup=1)
    assert times.images == [4, 4, 4] and len(times.rates) == 2 and times.first_batch_s >= 0
    seen: list[tuple[str, int]] = []
    loaders = {"a": [(None, [0])] * 3, "b": [(None, [0, 1])]}
    turns = take_turns(loaders, epochs=1, set_epochs={"a": lambda e: seen.append(("a", e))})
    assert {name: t.images for name, t in turns.items()} == {"a": [3, 3], "b": [2, 2]}
    assert seen == [("a", 0), ("a", 1)]


def test_cli_markdown_json_plot_and_per_sample_path(packed, tmp_path):
    varied = packed("lmdb", resize=64)  # sizes differ: the per-sample path with list batches
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    result = CliRunner().invoke(
        main,
        ["bench", str(varied), "--workers", "0", "--epochs", "1", "--batch-size", "8", "--random-reads", "4"]
        + ["--markdown", "--json", str(out_json), "--plot", str(out_png), "-q"],
    )
    assert result.exit_code == 0, result.output
    assert "| dataset | path | workers |" in result.output and "sample+list" in result.output
    data = json.loads(out_json.read_text())
    (run,) = data["runs"]
    assert run["read_path"] == "sample+list" and run["images"] == read_manifest(varied).num_samples
    assert data["datasets"][0]["output_size"] is None
    with Image.open(out_png) as img:
        assert img.format == "PNG"


def test_cli_subprocess_writes_json(fixed_ds, tmp_path):
    out = tmp_path / "bench.json"
    args = ["bench", fixed_ds, "--workers", "0", "--epochs", "1", "--random-reads", "0", "--json", out]
    proc = run_cli(*args, check=True, timeout=120)
    assert "lmdb:ds" in proc.stdout and "img/s" in proc.stdout
    data = json.loads(out.read_text())
    assert data["runs"][0]["images"] == read_manifest(fixed_ds).num_samples
    assert data["datasets"][0]["random_access"] is None


def test_cli_training_row_reads_random_resized_crops(packed, tmp_path):
    # A dataset whose stored sizes vary: only the random crop makes every image one size.
    varied = packed("lmdb", resize=48, encode="jpeg")
    out = tmp_path / "train.json"
    args = ["bench", varied, "--baseline", SAMPLE_DATA, "--augment", "rrc", "--augment-size", "32"]
    args += ["--workers", "0", "--epochs", "1", "--random-reads", "0", "--json", out, "-q"]
    proc = run_cli(*args, check=True, timeout=180)
    assert "RandomResizedCrop(32) + flip" in proc.stdout
    data = json.loads(out.read_text())
    assert data["settings"]["augment"] == "rrc"
    by_name = {d["name"]: d for d in data["datasets"]}
    assert by_name["lmdb:ds"]["read_path"] == "batch" and by_name["lmdb:ds"]["output_size"] == [32, 32]
    assert by_name[BASELINE_NAME]["read_path"] == "sample+stack"
    # the JPEG pack once more, decoded whole before the crop: the gain of decoding only the window
    assert by_name["lmdb:ds (whole decode)"]["read_path"] == "batch"
    assert "decode only the crop window: lmdb:ds, 0 worker(s):" in proc.stdout
    assert all(r["images"] == read_manifest(varied).num_samples for r in data["runs"])
    baseline = ImageFolderBaseline(
        SAMPLE_DATA, None, "numpy", **Settings(augment="rrc", augment_size=32).read_options()
    )
    assert baseline[0][0].shape == (32, 32, 3)
    with pytest.raises(ValueError, match="augment="):
        Settings(augment="mixup")


def test_cli_errors_are_one_line(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["bench", str(tmp_path)])
    assert result.exit_code == 1 and "manifest" in result.output.lower()
    assert "Traceback" not in result.output
    result = runner.invoke(main, ["bench", str(tmp_path), "--workers", "two"])
    assert result.exit_code == 2 and "worker counts" in result.output
    result = runner.invoke(main, ["bench", str(tmp_path), "--json", str(tmp_path / "no" / "b.json")])
    assert result.exit_code == 2 and "folder does not exist" in result.output


def test_dali_row_or_clear_error(fixed_ds):
    result = CliRunner().invoke(
        main,
        ["bench", str(fixed_ds), "--dali", "--workers", "0", "--epochs", "1", "--random-reads", "0", "-q"],
    )
    if HAS_DALI_MODULE:  # readers.dali present (DALI branch merged): a DALI row is measured
        assert result.exit_code == 0, result.output
        assert "dali:ds" in result.output and " dali " in result.output
    else:
        assert result.exit_code == 1
        assert "readers.dali" in result.output and "drop --dali" in result.output


def test_scaling_suite_small_sizes(tmp_path):
    from packer.bench.suites import scaling

    out_json, out_png = tmp_path / "scaling.json", tmp_path / "scaling.png"
    args = ["--sizes", "16,48", "--size", "64x48", "--resize", "32", "--crop", "28", "--workers", "1"]
    args += ["--read-workers", "0", "--out", str(tmp_path / "work"), "--json", str(out_json)]
    assert scaling.main([*args, "--plot", str(out_png)]) == 0
    small, large = json.loads(out_json.read_text())["points"]
    assert (small["n"], large["n"]) == (16, 48)
    assert 2 < large["disk_bytes"] / small["disk_bytes"] < 4  # three times the images
    for point in (small, large):
        assert point["pack_seconds"] > 0 and point["read_images_per_s"] > 0 and point["first_batch_s"] > 0
        assert point["read_path"] == "batch" and point["pack_peak_rss_bytes"] > 0
    with Image.open(out_png) as img:
        assert img.format == "PNG" and img.width > 800


def test_harness_imports_only_the_standard_library():
    # the fastpath suite times FFCV in FFCV's own Python with its child module and the harness;
    # pack bench --cold --peer ffcv runs packer.bench.ffcv_epoch there
    code = (
        "import sys, packer.bench.harness, packer.bench.suites.fastpath_child, packer.bench.ffcv_epoch; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'torch', 'psutil', 'PIL'}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"
