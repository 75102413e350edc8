"""Resume states are checked: every field at every level, the dataset they were saved on, and a state
saved after a finished pass resumes the next whole epoch."""

from __future__ import annotations

import pytest

from tests.support.cli import pack_sample

# -- every field of a resume state, at every level, is checked ----------------------------

RESUME_SPEC = {"resize": 40, "crop": 32, "encode": "png"}
DROP = object()  # a field taken out of the state


@pytest.mark.parametrize(
    "change, message",
    [
        ({"epoch": 10**30}, "'epoch'"),
        ({"epoch": 2**63}, "'epoch'"),
        ({"epoch": 1.0}, "'epoch'"),
        ({"position": 2.5}, "'position'"),
        ({"shuffle": 1}, "'shuffle'"),
        ({"seed": True}, "'seed'"),
        ({"world_size": 0}, "'world_size'"),
        ({"rank": 3}, "'rank'"),
        ({"unit": 0}, "'unit'"),
        ({"worker": 0}, "one DataLoader worker.s state"),  # not for the main process
    ],
)
def test_each_top_level_field_is_checked(packed, change, message):
    from readers import ResumeError, open_iterable

    it = open_iterable(packed("lmdb", **RESUME_SPEC), seed=1, batch_size=4)
    with pytest.raises(ResumeError, match=message):
        it.load_state_dict({**it.state_dict(consumed=8), **change})


def _loader_state(path, workers=2, steps=3):
    from readers import make_loader, open_iterable

    loader = make_loader(open_iterable(path, seed=1, batch_size=4), num_workers=workers)
    batches = iter(loader)
    for _ in range(steps):
        next(batches)
    state = loader.state_dict()
    del batches
    return state


@pytest.mark.parametrize(
    "change, message",
    [
        ({"worker_samples": 10**12}, r"'worker_samples'=1000000000000 is outside 0\.\.\d+"),
        ({"worker_samples": 2.5}, "'worker_samples' must be an integer"),
        ({"worker_samples": -1}, "'worker_samples'"),
        ({"epoch": 2}, "'epoch'=2 .* the loader's epoch 0"),  # 1 is an epoch boundary's snapshot
        ({"epoch": 2**63}, "'epoch'"),
        ({"worker": 1}, "'worker'=1 .* worker_0"),
        ({"num_workers": 3}, "'num_workers'=3"),
        ({"worker_samples": DROP}, "has worker, num_workers but not worker_samples"),
    ],
)
def test_each_worker_state_field_is_checked_when_the_loader_state_is_loaded(packed, change, message):
    from readers import ResumeError, make_loader, open_iterable

    path = packed("lmdb", **RESUME_SPEC)
    state = _loader_state(path)
    worker = state["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    assert "worker_samples" in worker  # the worker has read: its own progress is in the state
    for key, value in change.items():
        if value is DROP:
            del worker[key]
        else:
            worker[key] = value
    loader = make_loader(open_iterable(path, seed=1, batch_size=4), num_workers=2)
    with pytest.raises(ResumeError, match=message):
        loader.load_state_dict(state)


def test_the_loader_level_num_workers_is_checked(packed):
    from readers import ResumeError, make_loader, open_iterable

    path = packed("lmdb", **RESUME_SPEC)
    state = _loader_state(path)
    state["imgpack"]["num_workers"] = 2.0
    loader = make_loader(open_iterable(path, seed=1, batch_size=4), num_workers=2)
    with pytest.raises(ResumeError, match="'num_workers' must be an integer"):
        loader.load_state_dict(state)


def test_an_untouched_loader_state_still_resumes_exactly(packed):
    from readers import make_loader, open_iterable

    path = packed("lmdb", **RESUME_SPEC)
    full = [b[1].tolist() for b in make_loader(open_iterable(path, seed=1, batch_size=4), num_workers=2)]
    state = _loader_state(path)
    loader = make_loader(open_iterable(path, seed=1, batch_size=4), num_workers=2)
    loader.load_state_dict(state)
    assert [b[1].tolist() for b in loader] == full[3:]


# -- a resume state names the dataset it was saved on -------------------------------------
def test_a_state_from_another_seeds_pack_is_refused_naming_both(tmp_path):
    from readers import open_iterable
    from readers.order.resume import ResumeError

    for seed in (0, 1):
        pack_sample(tmp_path / f"seed{seed}", "lmdb", "--seed", str(seed))
    options = {"batch_size": 4, "crop": 24}
    saved = open_iterable(tmp_path / "seed0", **options)
    batches = iter(saved)
    next(batches)
    state = saved.state_dict()
    same = open_iterable(tmp_path / "seed0", **options)
    same.load_state_dict(state)  # the dataset it was saved on resumes
    state_without_id = {k: v for k, v in state.items() if k != "dataset"}
    same.load_state_dict(state_without_id)  # a state saved before states named their dataset
    other = open_iterable(tmp_path / "seed1", **options)
    with pytest.raises(ResumeError) as caught:
        other.load_state_dict(state)
    message = str(caught.value)
    assert "shuffled:0:" in message and "shuffled:1:" in message and str(tmp_path / "seed1") in message


# -- a state saved after a finished pass resumes the next epoch, whatever num_workers ----
@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_saved_after_a_finished_pass_resumes_the_next_whole_epoch(packed, workers):
    from readers import make_loader, open_iterable

    def loader():
        return make_loader(open_iterable(packed("lmdb"), batch_size=8, crop=24, seed=0), num_workers=workers)

    run = loader()
    first = [labels.tolist() for _, labels in run]
    state = run.state_dict()
    assert (state["imgpack"]["epoch"], state["imgpack"]["position"]) == (1, 0)
    uninterrupted = [labels.tolist() for _, labels in run]
    resumed = loader()
    resumed.load_state_dict(state)
    again = [labels.tolist() for _, labels in resumed]
    assert resumed.epoch == 1 and again == uninterrupted and again != first
