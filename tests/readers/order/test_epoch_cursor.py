"""The DALI loader keeps its epochs and resume on the code of open_iterable's stream
(``readers.order.epoch_cursor.EpochCursor``): the same epoch of each pass, the same state at the same
point, the same refusals, on DALI's own pipeline (CPU) and on the DataLoader paths."""

from __future__ import annotations

import pytest

from readers import open_iterable
from readers.dali import dali_loader
from readers.order.epoch_cursor import EpochCursor
from readers.order.resume import ResumeError

RAW = {"resize": 32, "crop": 32, "encode": "raw"}
OPTIONS = dict(batch_size=4, seed=5, block_size=4, buffer_size=16, pad_last=False)


def loaders(path):
    return {
        "dali-cpu": dali_loader(path, device="cpu", **OPTIONS),
        "fallback": dali_loader(path, device="dataloader", num_workers=0, **OPTIONS),
        "open_iterable": open_iterable(path, **OPTIONS),
    }


def walk(loader) -> list[tuple]:
    """(epoch, len, state) before each pass, after two batches of it, and after it, over three passes
    (the second chosen by set_epoch)."""
    seen = []
    for turn in range(3):
        if turn == 1:
            loader.set_epoch(4)
        seen.append((loader.epoch if turn == 1 else None, len(loader), core(loader.state_dict())))
        for i, _ in enumerate(loader):
            if turn == 2 and i == 1:
                seen.append(("mid", core(loader.state_dict())))
        seen.append((loader.epoch, core(loader.state_dict())))
    return seen


def core(state: dict) -> tuple:
    return state["epoch"], state["position"], state["offset"]


def test_every_path_walks_the_same_epochs_and_states(packed):
    path = packed("lmdb", **RAW)
    walks = {name: walk(loader) for name, loader in loaders(path).items()}
    assert walks["dali-cpu"] == walks["open_iterable"]  # one code: the same numbers, step for step
    assert [w[0] for w in walks["dali-cpu"] if isinstance(w[0], int)] == [0, 4, 4, 5]
    assert ("mid", (5, 8, 0)) in walks["dali-cpu"]
    # make_loader's StatefulDataLoader says "the next epoch's start" once a pass is over, where a
    # stream read in this process says "this epoch's end"; before a first or chosen pass and
    # mid-pass all agree.
    assert [walks["dali-cpu"][i] for i in (0, 2, 5)] == [walks["fallback"][i] for i in (0, 2, 5)]
    assert isinstance(loaders(path)["dali-cpu"], EpochCursor)


def test_a_loaded_state_refuses_another_epoch_the_same_way_on_every_path(packed):
    path = packed("lmdb", **RAW)
    source = dali_loader(path, device="cpu", **OPTIONS)
    source.set_epoch(2)
    for i, _ in enumerate(source):
        if i == 2:
            break
    state = source.state_dict()
    assert core(state) == (2, 12, 0)
    messages = set()
    for name, loader in loaders(path).items():
        loader.load_state_dict(state)
        assert len(loader) == len(source) - 3, name
        with pytest.raises(ResumeError) as info:
            loader.set_epoch(3)
        messages.add(str(info.value))
        loader.set_epoch(2)  # the state's own epoch is allowed
    assert len(messages) == 1 and "resumes epoch 2" in messages.pop()
