"""`--samples-per-shard N` cuts at dataset indices: every shard but the last holds N kept samples
whatever was skipped, for the pool (1 and 2 workers) and Ray, every format, local and s3://,
the same bytes on every path, and after a kill and `--resume` (packer/engine/_part_plan.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packer.engine import _ray_engine as ray_engine
from packer.engine.pack_run import pack_folder
from packer.output.output_dir import PROGRESS_NAME
from packer.sources.source import scan_folder
from readers import open_dataset, read_manifest, source_paths
from readers.formats import format_names
from tests.packer.engine.test_pack_order import SPEC, digest_tree
from tests.support.formats import numbered_and_not
from tests.support.packrun import SLOW_PACK, copy_source, kill_after_parts, run_pack

PER_SHARD = 10
GOOD = 88  # sample_data twice
FORMATS = format_names()
NUMBERED_AND_NOT = numbered_and_not()


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    """88 good images and 9 undecodable ones: the first file, the last two, one in each class."""
    root = copy_source(tmp_path_factory.mktemp("cuts") / "src", copies=2)
    classes = sorted(p for p in root.iterdir() if p.is_dir())
    (classes[0] / "000-broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    for j in range(2):
        (classes[-1] / f"zzz-broken{j}.jpg").write_bytes(b"\xff\xd8 not a jpeg either")
    for folder in classes:
        (folder / "copy0" / "m-broken.jpg").write_bytes(b"\xff\xd8 broken in the middle")
    return root


SKIPPED = 3 + 5  # the files the fixture breaks (sample_data has five classes)


def assert_cut_at_indices(out, options=None) -> list[int]:
    """Every shard but the last holds PER_SHARD samples; no gap in the first indices; the skips
    recorded; the samples read back. The shard sizes."""
    manifest = read_manifest(out, options)
    counts = [s.count for s in manifest.shards]
    assert counts == [PER_SHARD] * (GOOD // PER_SHARD) + [GOOD % PER_SHARD], counts
    assert [s.first for s in manifest.shards] == [PER_SHARD * k for k in range(len(counts))]
    assert manifest.num_samples == GOOD and len(manifest.skipped) == SKIPPED
    assert len(source_paths(out, options)) == GOOD
    return counts


@pytest.mark.parametrize("order", ["shuffled", "source"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_shard_but_the_last_holds_n_kept_samples_for_1_and_2_workers(src, tmp_path, fmt, order):
    """In source order the first file and the last two are skipped: the last shard takes the
    trailing skips, no empty shard follows it."""
    trees = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        report = pack_folder(src, out, fmt, SPEC, workers=workers, order=order,
                             options={"samples_per_shard": PER_SHARD})  # fmt: skip
        assert (report.packed, report.skipped) == (GOOD, SKIPPED)
        assert_cut_at_indices(out)
        ds = open_dataset(out, decode="numpy")
        assert len(ds) == GOOD and ds[GOOD - 1][0].shape[-1] == 3
        trees.append(digest_tree(out))
    assert trees[0] == trees[1]


def test_shards_is_a_count_of_source_files_per_part(src, tmp_path):
    """--shards S: S parts of ceil(files / S) source files each, what was skipped among them left out."""
    pack_folder(src, tmp_path / "out", "tar", SPEC, workers=2, order="source", options={"shards": 4})
    rels = [item.rel for item in scan_folder(src).items]
    per_part = -(-len(rels) // 4)
    kept = [sum("broken" not in rel for rel in rels[k : k + per_part]) for k in range(0, len(rels), per_part)]
    assert [s.count for s in read_manifest(tmp_path / "out").shards] == kept != [per_part] * 4


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_ray_re_cuts_after_the_skips_and_writes_the_bytes_of_the_pool(ray_cluster, src, tmp_path, fmt):
    options = {"samples_per_shard": PER_SHARD}
    pack_folder(src, tmp_path / "pool", fmt, SPEC, workers=2, options=options)
    report = pack_folder(src, tmp_path / "ray", fmt, SPEC, engine="ray", options=options)
    assert (report.packed, report.skipped, report.engine) == (GOOD, SKIPPED, "ray")
    assert_cut_at_indices(tmp_path / "ray")
    assert digest_tree(tmp_path / "ray") == digest_tree(tmp_path / "pool")  # no part the re-cut dropped left


def interrupt_after(monkeypatch, parts: int) -> None:
    """Stop the Ray driver (as Ctrl-C would) when ``parts`` parts have come back."""
    real, seen = ray_engine.part_from_dict, []

    def counting(data):
        seen.append(data["part"])
        if len(seen) > parts:
            raise KeyboardInterrupt
        return real(data)

    monkeypatch.setattr(ray_engine, "part_from_dict", counting)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("stop_at", [3, 12])  # in the provisional round; in the re-cut (10 parts before)
def test_an_interrupted_ray_pack_resumes_to_the_uninterrupted_bytes(ray_cluster, src, tmp_path, monkeypatch,
                                                                    stop_at):  # fmt: skip
    """The progress file records each part's start and length in the pack order, so a resume
    by either engine ends with the parts of a pack never stopped."""
    fmt, options = NUMBERED_AND_NOT[0], {"samples_per_shard": PER_SHARD}
    pack_folder(src, tmp_path / "whole", fmt, SPEC, workers=1, options=options)
    for engine in ("ray", "local"):
        out = tmp_path / engine
        with monkeypatch.context() as patch:
            interrupt_after(patch, stop_at)
            with pytest.raises(KeyboardInterrupt):
                pack_folder(src, out, fmt, SPEC, engine="ray", options=options)
        assert json.loads((out / PROGRESS_NAME).read_text())["parts"]  # something to resume
        pack_folder(src, out, fmt, SPEC, engine=engine, workers=2, options=options, resume=True)
        assert_cut_at_indices(out)
        assert digest_tree(out) == digest_tree(tmp_path / "whole"), engine


def test_a_resume_drops_the_parts_a_dead_ray_run_left_staged(src, tmp_path, monkeypatch):
    """A Ray task still writing when its driver died leaves files below .ray-staging; a resume
    (here by the local engine) removes them, so the output is the uninterrupted pack's, file for file."""
    fmt, options = NUMBERED_AND_NOT[0], {"samples_per_shard": PER_SHARD}
    pack_folder(src, tmp_path / "whole", fmt, SPEC, workers=1, options=options)
    out = tmp_path / "resumed"
    from packer.engine import _local_engine as local_engine

    real, written = local_engine.write_part, []

    def stop_after_three(*args, **kwargs):
        if len(written) == 3:
            raise KeyboardInterrupt
        written.append(real(*args, **kwargs))
        return written[-1]

    with monkeypatch.context() as patch:
        patch.setattr(local_engine, "write_part", stop_after_three)
        with pytest.raises(KeyboardInterrupt):
            pack_folder(src, out, fmt, SPEC, workers=1, options=options)
    late = out / ".ray-staging" / "0123abcd"
    late.mkdir(parents=True)
    (late / "part-000005-00000.tar").write_bytes(b"a late task's part")
    pack_folder(src, out, fmt, SPEC, workers=2, options=options, resume=True)
    assert digest_tree(out) == digest_tree(tmp_path / "whole")


@pytest.mark.parametrize("fmt", NUMBERED_AND_NOT)
def test_kill_9_mid_pack_then_resume_gives_the_uninterrupted_pack(src, tmp_path, fmt):
    args = ("--to", fmt, "--samples-per-shard", PER_SHARD, "--workers", "2", "-q", *SLOW_PACK)
    rc, text = run_pack(src, "-o", tmp_path / "whole", *args)
    assert rc == 0, text
    out = tmp_path / "resumed"
    kill_after_parts(src, out, args, parts=2)
    rc, text = run_pack(src, "-o", out, *args, "--resume")
    assert rc == 0, text
    assert_cut_at_indices(out)
    assert digest_tree(out) == digest_tree(tmp_path / "whole")


def download_tree(fs, url: str, dest: Path) -> dict[str, str]:
    fs.get(url.removeprefix("s3://") + "/", str(dest) + "/", recursive=True)
    return digest_tree(dest)


@pytest.mark.parametrize("fmt", NUMBERED_AND_NOT)
def test_a_pack_to_s3_is_cut_at_dataset_indices(s3, src, tmp_path, fmt):
    from tests.support.s3server import BUCKET

    fs, storage = s3
    url, options = f"s3://{BUCKET}/cuts-{fmt}", {"samples_per_shard": PER_SHARD}
    pack_folder(src, url, fmt, SPEC, workers=2, options=options, storage_options=storage)
    assert_cut_at_indices(url, storage)
    pack_folder(src, tmp_path / "local", fmt, SPEC, workers=1, options=options)
    assert download_tree(fs, url, tmp_path / "got") == digest_tree(tmp_path / "local")


@pytest.mark.ray
@pytest.mark.slow
def test_ray_to_s3_drops_the_parts_the_re_cut_no_longer_has(ray_cluster, s3, src, tmp_path):
    from tests.support.s3server import BUCKET

    fs, storage = s3
    storage = {**storage, "key": "testing", "secret": "testing"}  # the cluster started without them
    fmt, options = NUMBERED_AND_NOT[0], {"samples_per_shard": PER_SHARD}
    url = f"s3://{BUCKET}/ray-cuts"
    pack_folder(src, url, fmt, SPEC, engine="ray", options=options, storage_options=storage)
    assert_cut_at_indices(url, storage)
    pack_folder(src, tmp_path / "local", fmt, SPEC, workers=1, options=options)
    assert download_tree(fs, url, tmp_path / "got") == digest_tree(tmp_path / "local")  # nothing stray


@pytest.mark.ray
@pytest.mark.slow
def test_a_re_cut_task_copies_carried_results_and_decodes_only_the_rest(ray_cluster, src, monkeypatch):
    """The Ray re-cut copies encoded samples from the earlier tasks' results instead of decoding
    them again (packer/engine/_ray_carry.py)."""
    import ray

    from packer.engine import _ray_carry as ray_carry
    from packer.engine.parts import preprocess_items

    items = list(scan_folder(src).items[:30])
    earlier = list(preprocess_items(items[:20], SPEC))
    decoded = []

    def counting(chunk, *args):
        decoded.extend(item.rel for item in chunk)
        return preprocess_items(chunk, *args)

    monkeypatch.setattr(ray_carry, "preprocess_items", counting)
    sources = ray_carry.overlapping({0: (20, ray.put(earlier)), 40: (10, ray.put([]))}, 5, 25)
    assert [s for s, _, _ in sources] == [0]
    got = list(ray_carry.carried_or_preprocessed(items[5:30], 5, sources, SPEC, None, None))
    assert decoded == [item.rel for item in items[20:30]]  # only the files no earlier task held
    fresh = list(preprocess_items(items[5:30], SPEC))
    assert [(r.rel, r.data) if not isinstance(r, tuple) else r for r in got] == [
        (r.rel, r.data) if not isinstance(r, tuple) else r for r in fresh
    ]


@pytest.mark.parametrize("seed", range(20))
def test_the_pool_s_fill_and_the_exact_cut_agree_on_any_skips(seed):
    """The two ways of cutting (the pool filling parts from a stream, the plan from the skips
    the written parts recorded) give the same parts, and each part but the last holds N."""
    import numpy as np

    from packer.engine._part_plan import Lookahead, fill_part, plan_parts
    from packer.engine.parts import FIRST_KEY, SKIPPED_AT_KEY, SOURCE_COUNT_KEY, SOURCE_START_KEY
    from readers.formats.writer_base import PartResult

    rng = np.random.default_rng(seed)
    total, per_part = int(rng.integers(1, 60)), int(rng.integers(1, 8))
    skip = rng.random(total) < rng.choice([0.0, 0.2, 0.6])
    stream = Lookahead(iter([(i, f"f{i}", "bad") if skip[i] else object() for i in range(total)]))
    done, start, part = {}, 0, 0
    while stream.more():
        taken = list(fill_part(stream, per_part))
        skipped = [i for i, r in enumerate(taken) if isinstance(r, tuple)]
        extra = {FIRST_KEY: part * per_part, SKIPPED_AT_KEY: skipped, SOURCE_START_KEY: start,
                 SOURCE_COUNT_KEY: len(taken)}  # fmt: skip
        done[part] = PartResult(part, [], [], extra)
        start, part = start + len(taken), part + 1
    assert start == total
    kept = [r.extra[SOURCE_COUNT_KEY] - len(r.extra[SKIPPED_AT_KEY]) for r in done.values()]
    if (~skip).any():
        assert kept[:-1] == [per_part] * (len(kept) - 1) and 0 < kept[-1] <= per_part
    plan = plan_parts(total, per_part, True, done)
    where = {p: (r.extra[SOURCE_START_KEY], r.extra[SOURCE_COUNT_KEY]) for p, r in done.items()}
    assert [(c.part, c.start, c.stop) for c in plan.cuts] == [(p, a, a + n) for p, (a, n) in where.items()]
    assert all(plan.fits(r, check_first=True) for r in done.values())
