"""DataLoader workers are forked with their parent's heap out of garbage collection
(readers.process.frozen_for_fork): a worker's collections neither walk (and copy) the parent's
objects nor finalize its garbage, and the parent takes its objects back once they are forked."""

from __future__ import annotations

import gc
import os

import pytest

from readers import make_loader, open_iterable
from tests.support.worker_calls import CALLS_ENV

READ = {"seed": 3, "batch_size": 4, "crop": 32}


def note_freeze_count(_worker_id: int) -> None:
    """A worker_init_fn: notes how many objects are frozen here, then collects (as a worker's
    allocations soon would)."""
    with open(os.environ[CALLS_ENV], "a") as fh:
        fh.write(f"{gc.get_freeze_count()}\n")
    gc.collect()


class ParentGarbage:
    """A cycle that is garbage in the parent when the workers are forked: its finalizer must not
    run in a worker (it would act on the parent's resources there)."""

    def __init__(self, path):
        self.path = path
        self.me = self

    def __del__(self):
        if os.getpid() != self.parent:
            with open(self.path, "a") as fh:
                fh.write("finalized in a worker\n")


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_are_forked_with_the_parents_heap_frozen(packed, tmp_path, monkeypatch, persistent):
    local = packed("tar", resize=32, crop=32)
    calls = tmp_path / "calls"
    monkeypatch.setenv(CALLS_ENV, str(calls))
    alone = make_loader(open_iterable(local, **READ))
    want = [[y.tolist() for _, y in alone] for _ in range(2)]  # epochs 0 and 1
    loader = make_loader(
        open_iterable(local, **READ),
        num_workers=2,
        worker_init_fn=note_freeze_count,
        persistent_workers=persistent,
    )
    gc.disable()  # the cycle stays uncollected in the parent until the workers are forked
    try:
        garbage = ParentGarbage(tmp_path / "finalized")
        garbage.parent = os.getpid()
        del garbage
        for epoch in range(2):  # persistent workers: forked at the first pass only
            got = []
            for _, y in loader:
                got.append(y.tolist())
                assert gc.get_freeze_count() == 0  # this process took its objects back
            assert got == want[epoch]
    finally:
        gc.enable()
    counts = [int(n) for n in calls.read_text().split()]
    assert len(counts) == (2 if persistent else 4) and all(n > 0 for n in counts), counts
    gc.collect()  # the parent's own collection finalizes it, here
    assert not (tmp_path / "finalized").exists()


def test_objects_a_program_froze_stay_frozen(packed, tmp_path, monkeypatch):
    local = packed("tar", resize=32, crop=32)
    monkeypatch.setenv(CALLS_ENV, str(tmp_path / "calls"))
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        loader = make_loader(open_iterable(local, **READ), num_workers=2, worker_init_fn=note_freeze_count)
        assert sum(len(y) for _, y in loader) > 0
        assert gc.get_freeze_count() > frozen // 2  # not taken back (a few were freed since)
    finally:
        gc.unfreeze()
