"""Resume that cannot go wrong: kill -9 a real training script mid-epoch, resume, compare.

The training script (tests/support/train_script.py) records which samples every step trained on and
checkpoints ``loader.state_dict()`` (``readers.make_loader``, a StatefulDataLoader) each step.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from readers import ResumeError, make_loader, open_dataset, open_iterable
from tests.conftest import REPO, cli_env
from tests.support.train_script import sample_ids

SCRIPT = REPO / "tests" / "support" / "train_script.py"
SPEC = {"resize": 40, "crop": 32, "encode": "png"}
PER_EPOCH = 11  # 44 samples in batches of 4


def train(path, out: Path, *options: str, kill_at=(), attempts: int = 6) -> list[list]:
    """Run the script until it finishes, resuming after every kill; the per-step record."""
    out.mkdir(parents=True, exist_ok=True)
    kills = 0
    for attempt in range(attempts):
        cmd = [sys.executable, str(SCRIPT), str(path), str(out), *options, "--attempt", str(attempt)]
        if kill_at:
            cmd += ["--kill-at", *map(str, kill_at)]
        returncode, log = run_logged(cmd, out / f"log-{attempt}.txt")
        if returncode == 0:
            break
        assert "Traceback" not in log or "ProcessExitedException" in log, log
        kills += 1
    else:
        raise AssertionError(f"still not finished after {attempts} attempts")
    assert kills == len(kill_at), f"expected {len(kill_at)} kills, got {kills}"
    return [torch.load(p, weights_only=False)["record"] for p in sorted(out.glob("rank*.pt"))]


def run_logged(cmd: list[str], log: Path) -> tuple[int, str]:
    # A file, not a pipe: a killed process's DataLoader workers may hold a pipe open for seconds.
    with open(log, "w") as handle:
        run = subprocess.run(cmd, stdout=handle, stderr=subprocess.STDOUT, timeout=400, env=cli_env())
    returncode = run.returncode
    return returncode, log.read_text()


def all_ids(path) -> list[str]:
    ds = open_dataset(path, decode="tensor")
    return sorted(sample_ids(torch.stack([ds[i][0] for i in range(len(ds))])))


# Kill points: mid-epoch, at the first batch after an epoch boundary, right after a resume.
KILLS = (5, PER_EPOCH, PER_EPOCH + 1)
REFERENCES: dict[tuple[str, str], list] = {}


@pytest.mark.parametrize(
    "fmt, mode, workers, persistent",
    [
        ("lmdb", "batch", 0, False),
        ("lmdb", "batch", 2, False),
        ("lmdb", "batch", 2, True),
        ("lmdb", "sample", 0, False),
        ("lmdb", "sample", 2, False),
        ("lmdb", "sample", 2, True),
        ("tar", "batch", 2, True),
        ("tar", "sample", 2, False),
    ],
)
@pytest.mark.slow
def test_kill_and_resume_trains_on_exactly_the_uninterrupted_samples(
    packed, tmp_path, fmt, mode, workers, persistent
):
    path = packed(fmt, **SPEC)
    options = ["--mode", mode, "--workers", str(workers), *(["--persistent"] if persistent else [])]
    # The uninterrupted run depends on the dataset and mode only (the order is the same for any
    # number of workers): made once per pair.
    key = (str(path), mode)
    if key not in REFERENCES:
        (REFERENCES[key],) = train(path, tmp_path / "ref", "--mode", mode)
    reference = REFERENCES[key]
    assert len(reference) == 2 * PER_EPOCH
    assert sorted(i for step in reference[:PER_EPOCH] for i in step[1:]) == all_ids(path)
    (resumed,) = train(path, tmp_path / "killed", *options, kill_at=KILLS)
    assert resumed == reference


@pytest.mark.slow
@pytest.mark.parametrize("mode, workers", [("batch", 2), ("sample", 2), ("batch", 0)])
def test_kill_mid_epoch_2_without_set_epoch_continues_exactly(packed, tmp_path, mode, workers):
    """Epochs advance by themselves: the loop never calls set_epoch, before or after the kills,
    and trains on what an uninterrupted run with set_epoch(epoch) trains on."""
    path = packed("lmdb", **SPEC)
    common = ("--mode", mode, "--epochs", "3")
    (reference,) = train(path, tmp_path / "ref", *common)
    assert [step[0] for step in reference] == [e for e in range(3) for _ in range(PER_EPOCH)]
    auto = ("--auto-epoch", "--workers", str(workers), "--persistent")
    (resumed,) = train(path, tmp_path / "killed", *common, *auto, kill_at=(PER_EPOCH + 1, 2 * PER_EPOCH + 5))
    assert resumed == reference
    epochs = [{i for step in reference if step[0] == e for i in step[1:]} for e in range(3)]
    assert epochs[0] == epochs[1] == epochs[2] == set(all_ids(path))
    orders = [[i for step in reference if step[0] == e for i in step[1:]] for e in range(3)]
    assert orders[0] != orders[1] != orders[2]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["batch", "sample"])
def test_kill_and_resume_under_a_two_rank_gloo_group(packed, tmp_path, mode):
    path = packed("lmdb", **SPEC)
    options = ("--mode", mode, "--world", "2", "--workers", "1", "--persistent", "--epochs", "1")
    ref = train(path, tmp_path / "ref", *options)
    got = train(path, tmp_path / "killed", *options, kill_at=(2, 4))
    assert got == ref
    per_epoch = [i for rank in ref for step in rank if step[0] == 0 for i in step[1:]]
    assert sorted(per_epoch) == all_ids(path)  # 44 samples, 2 ranks x 22: each exactly once


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("before, after", [(2, 1), (1, 2), (2, 3)])
def test_elastic_resume_covers_the_epoch_exactly_once(packed, tmp_path, before, after):
    path = packed("lmdb", **SPEC)
    # Run `before` ranks for 2 steps of epoch 0 (killed at step 2), then finish with `after` ranks.
    out = tmp_path / "first"
    out.mkdir()
    cmd = [sys.executable, str(SCRIPT), str(path), str(out), "--world", str(before), "--epochs", "1"]
    returncode, log = run_logged([*cmd, "--kill-at", "2"], tmp_path / "first.log")
    assert returncode != 0, log
    before_records = [torch.load(p, weights_only=False)["record"] for p in sorted(out.glob("rank*.pt"))]
    assert all(len(r) == 2 for r in before_records)
    finished = train(
        path,
        tmp_path / "second",
        "--world",
        str(after),
        "--epochs",
        "1",
        "--resume-from",
        str(out / "rank0.pt"),
    )
    seen = [i for rank in before_records + finished for step in rank for i in step[1:]]
    everything = all_ids(path)
    assert set(seen) == set(everything)
    assert len(seen) - len(everything) < before + after  # only the wrap-around padding repeats
    assert len({len(rank) for rank in finished}) == 1  # ranks still take equal steps


# -- the rules, in process ----------------------------------------------------------------------
def batches(loader) -> list[list[int]]:
    return [labels.tolist() + [int(images.float().sum())] for images, labels in loader]


def test_persistent_workers_read_full_epochs_after_a_resume(packed):
    path = packed("lmdb", **SPEC)
    reference_it = open_iterable(path, seed=1, batch_size=4)
    reference = []
    for epoch in range(3):
        reference_it.set_epoch(epoch)
        reference.append(batches(DataLoader(reference_it, batch_size=None)))
    it = open_iterable(path, seed=1, batch_size=4)
    it.load_state_dict(reference_it_state(path, epoch=0, consumed=12))
    assert len(it) == PER_EPOCH - 3  # what is left of the resumed epoch
    loader = DataLoader(it, batch_size=None, num_workers=2, persistent_workers=True)
    it.set_epoch(0)  # the state's own epoch: the resume point stays
    got = [batches(loader)]
    for epoch in (1, 2):
        it.set_epoch(epoch)
        assert len(it) == PER_EPOCH
        got.append(batches(loader))
    assert got == [reference[0][3:], reference[1], reference[2]]


def reference_it_state(path, epoch: int, consumed: int) -> dict:
    it = open_iterable(path, seed=1, batch_size=4)
    it.set_epoch(epoch)
    return it.state_dict(consumed=consumed)


def test_set_epoch_contradicting_a_loaded_state_is_an_error_naming_both_epochs(packed):
    path = packed("lmdb", **SPEC)
    for loader in (None, 0, 2):
        it = open_iterable(path, seed=1, batch_size=4)
        target = it if loader is None else make_loader(it, num_workers=loader)
        it.load_state_dict(reference_it_state(path, epoch=2, consumed=8))
        with pytest.raises(
            ResumeError, match=r"set_epoch\(3\) contradicts the loaded state, which resumes epoch 2"
        ):
            target.set_epoch(3)
        target.set_epoch(2)  # the state's own epoch: the resume point stays
        assert len(it) == PER_EPOCH - 2 and it.state_dict()["position"] == 8


def test_each_pass_is_the_next_epoch_for_any_workers_and_set_epoch_overrides(packed):
    path = packed("lmdb", **SPEC)
    reference_it = open_iterable(path, seed=1, batch_size=4)
    reference = []
    for epoch in (0, 1, 2, 7, 8):
        reference_it.set_epoch(epoch)
        reference.append(batches(DataLoader(reference_it, batch_size=None)))
    assert reference[0] != reference[1] != reference[2]
    runs = {}
    for workers, persistent in ((0, False), (2, False), (2, True)):
        it = open_iterable(path, seed=1, batch_size=4)
        loader = make_loader(it, num_workers=workers, persistent_workers=persistent)
        got = [batches(loader) for _ in range(3)]
        loader.set_epoch(7)  # overrides, then the passes go on from there
        got += [batches(loader) for _ in range(2)]
        assert loader.epoch == 8
        runs[(workers, persistent)] = got
    plain = open_iterable(path, seed=1, batch_size=4)  # the iterable itself, no loader
    runs["iterable"] = [
        [labels.tolist() + [int(images.float().sum())] for images, labels in plain] for _ in range(3)
    ]
    for name, got in runs.items():
        assert got == reference[: len(got)], name


def test_load_state_dict_while_iterating_is_a_one_line_error(packed):
    path = packed("lmdb", **SPEC)
    it = open_iterable(path, seed=1, batch_size=4)
    running = iter(it)
    next(running)
    with pytest.raises(ResumeError, match="while this stream is being iterated; call it before"):
        it.load_state_dict(it.state_dict())
    loader = make_loader(open_iterable(path, seed=1, batch_size=4), num_workers=2)
    batches_of = iter(loader)
    next(batches_of)
    with pytest.raises(ResumeError, match="while the loader is being iterated; call it before"):
        loader.load_state_dict(loader.state_dict())
    del batches_of


def test_make_loader_prints_no_third_party_warning(packed):
    import warnings

    path = packed("lmdb", **SPEC)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = make_loader(open_iterable(path, seed=1, batch_size=4), num_workers=0)
        assert len(batches(loader)) == PER_EPOCH


def test_state_dict_in_the_main_process_refuses_to_guess_what_workers_read(packed):
    path = packed("lmdb", **SPEC)
    it = open_iterable(path, seed=1, batch_size=4)
    for _ in zip(range(3), DataLoader(it, batch_size=None, num_workers=2)):
        pass
    with pytest.raises(ResumeError, match="make_loader"):
        it.state_dict()
    assert it.state_dict(consumed=12)["position"] == 12


def test_per_sample_order_is_independent_of_num_workers(packed):
    path = packed("lmdb", **SPEC)
    runs = []
    for workers in (0, 2, 3):
        it = open_iterable(path, seed=5, block_size=4, buffer_size=8)
        runs.append(batches(make_loader(it, batch_size=4, num_workers=workers)))
    assert runs[0] == runs[1] == runs[2] and len(runs[0]) == PER_EPOCH


@pytest.mark.parametrize(
    "change, message",
    [
        ({"seed": 2}, "seed=2"),
        ({"num_samples": 45}, "num_samples=45"),
        ({"position": 45}, "position"),
        ({"position": -1}, "position"),
        ({"offset": 4}, "offset"),
        ({"epoch": "1"}, "epoch"),
        ({"imgpack_state": 9}, "version"),
    ],
)
def test_bad_states_are_clear_errors(packed, change, message):
    path = packed("lmdb", **SPEC)
    it = open_iterable(path, seed=1, batch_size=4)
    state = {**it.state_dict(), **change}
    with pytest.raises(ResumeError, match=message):
        it.load_state_dict(state)


def test_missing_fields_old_states_and_out_of_range_consumed_are_clear_errors(packed):
    path = packed("lmdb", **SPEC)
    it = open_iterable(path, seed=1, batch_size=4)
    with pytest.raises(ResumeError, match="missing"):
        it.load_state_dict({})
    with pytest.raises(ResumeError, match="older imgpack"):
        it.load_state_dict({"epoch": 0, "consumed": 8, "seed": 1, "num_samples": 44, "world_size": 1})
    with pytest.raises(ResumeError, match="consumed=10000"):
        it.state_dict(consumed=10000)
    with pytest.raises(ResumeError, match="same world_size"):
        two = open_iterable(path, seed=1, batch_size=4, rank=0, world_size=2)
        two.load_state_dict({**it.state_dict(consumed=2), "world_size": 1})
