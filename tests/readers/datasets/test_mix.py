"""readers.datasets.mix: weighted, deterministic mixing of packed datasets of different formats."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from readers import make_loader, mix, open_dataset
from readers.datasets.mix import quotas
from tests.support.formats import formats_storing

FIXED = {"resize": 40, "crop": 32, "encode": "png"}
FORMATS = formats_storing(FIXED["encode"])  # every format that can: each one takes part in the mix
N = len(FORMATS)


@pytest.fixture
def paths(packed):
    return [packed(fmt, options={"shards": 2}, **FIXED) for fmt in FORMATS]


def collect(m, num_workers=0):
    loader = DataLoader(m, batch_size=None, num_workers=num_workers)
    if m.batch_size is None:
        return [(bytes(image), int(label)) for image, label in loader]
    return [(images.clone(), labels.clone()) for images, labels in loader]


def test_quotas_add_up_and_follow_the_weights():
    assert quotas([1, 1, 1], 10).tolist() == [4, 3, 3]
    assert quotas([0.6, 0.3, 0.1], 1000).tolist() == [600, 300, 100]
    assert quotas([2, 0, 1], 7).sum() == 7 and quotas([2, 0, 1], 7)[1] == 0


def chi2_bound(dof: int, z: float = 3.09) -> float:
    """The chi-square quantile at p = 0.001 (z of 0.999), by Wilson-Hilferty (within ~3%)."""
    h = 2 / (9 * dof)
    return dof * (1 - h + z * math.sqrt(h)) ** 3


def test_realised_proportions_match_the_weights(paths):
    weights = np.arange(N, 0, -1) / (N * (N + 1) / 2)  # N=3: 1/2, 1/3, 1/6
    m = mix(paths, weights=weights.tolist(), seed=3, epoch_size=900, decode="bytes")
    p = weights
    expected = quotas(weights.tolist(), 900)  # N=3: 450, 300, 150
    for epoch in (0, 1):
        m.set_epoch(epoch)
        labels = [label for _, label in collect(m)]
        dataset, _ = m.split_labels(labels)
        counts = np.bincount(dataset, minlength=N)
        assert counts.tolist() == expected.tolist()  # exact over an epoch
        for n in (100, 300):  # any stretch is a draw without replacement: within binomial bounds
            k = np.bincount(dataset[:n], minlength=N)
            assert np.all(np.abs(k - n * p) <= 4 * np.sqrt(n * p * (1 - p))), (n, k)
            chi2 = float(np.sum((k - n * p) ** 2 / (n * p)))
            assert chi2 < chi2_bound(N - 1)
    # over many batches, the per-batch mixture spreads like a multinomial
    batches = np.asarray(dataset).reshape(-1, 30)
    per_batch = np.stack([np.bincount(b, minlength=N) for b in batches])
    assert np.abs(per_batch.mean(0) - 30 * p).max() < 1.5


def test_labels_are_offset_per_dataset_and_point_at_the_right_sample(paths):
    m = mix(paths, weights=[1] * N, seed=0, decode="bytes")
    sizes = [len(open_dataset(p)) for p in paths]
    class_counts = [len(open_dataset(p).classes) for p in paths]
    assert m.offsets == np.cumsum([0, *class_counts[:-1]]).tolist()
    assert len(m.classes) == sum(class_counts) and m.classes[class_counts[0]].startswith("1:")
    lookup = []
    for path in paths:
        ds = open_dataset(path, decode="bytes")
        lookup.append({ds[i][0]: ds[i][1] for i in range(len(ds))})
    seen = collect(m)
    assert len(seen) == sum(sizes)
    dataset, local = m.split_labels([label for _, label in seen])
    for (image, _), d, y in zip(seen, dataset.tolist(), local.tolist()):
        assert lookup[d][image] == y
    shared = mix(paths, weights=[1] * N, labels="shared", decode="bytes")
    assert shared.classes == open_dataset(paths[0]).classes
    assert sorted(label for _, label in collect(shared)) == sorted(
        [y for _, y in open_dataset(paths[0], decode="bytes")] * N
    )


def test_order_is_a_function_of_seed_and_epoch_for_any_workers(paths):
    m = mix(paths, weights=[2] + [1] * (N - 1), seed=1, batch_size=8, crop=24)
    m.set_epoch(2)
    reference = collect(m, 0)
    assert len(reference) == len(m) == math.ceil(sum(len(open_dataset(p)) for p in paths) / 8)
    assert reference[0][0].shape == (8, 3, 24, 24)
    for workers in (1, 2):
        got = collect(m, workers)
        assert all(torch.equal(a, b) and torch.equal(la, lb) for (a, la), (b, lb) in zip(reference, got))
        assert len(got) == len(reference)
    m.set_epoch(3)
    other = collect(m, 0)
    assert any(not torch.equal(la, lb) for (_, la), (_, lb) in zip(reference, other))
    again = mix(paths, weights=[2] + [1] * (N - 1), seed=1, batch_size=8, crop=24)
    again.set_epoch(2)
    assert all(torch.equal(la, lb) for (_, la), (_, lb) in zip(reference, collect(again, 0)))


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_split_the_global_sequence(paths, drop_last):
    single = mix(paths, weights=list(range(N, 0, -1)), seed=5, epoch_size=101, decode="bytes")
    whole = collect(single)
    parts = [collect(mix(paths, weights=list(range(N, 0, -1)), seed=5, epoch_size=101, decode="bytes", rank=r,
                         world_size=3,
                         drop_last=drop_last)) for r in range(3)]  # fmt: skip
    assert len({len(p) for p in parts}) == 1
    joined = [p[k] for k in range(len(parts[0])) for p in parts]  # ranks are dealt in turn
    if drop_last:
        assert joined == whole[:99]
    else:
        assert joined[:101] == whole and joined[101:] == whole[:1]


def test_a_downsampled_dataset_is_covered_across_epochs(paths):
    m = mix(paths[:2], weights=[1, 3], seed=2, epoch_size=44, decode="bytes")  # 11 of dataset 0 per epoch
    n = len(open_dataset(paths[0]))
    seen = []
    for epoch in range(n // 11):
        m.set_epoch(epoch)
        source, index = m.epoch_sequence(epoch)
        seen += index[source == 0].tolist()
    assert sorted(seen) == list(range(n))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_yields_exactly_the_remaining_batches(paths, num_workers):
    m = mix(paths, weights=[1, 2] + [1] * (N - 2), seed=4, batch_size=6, crop=24)
    m.set_epoch(1)
    full = collect(m, num_workers)
    k = 4
    m.set_epoch(1)  # again (a new pass in this process would be the next epoch)
    for taken, _ in enumerate(DataLoader(m, batch_size=None, num_workers=num_workers), 1):
        if taken == k:
            break
    state = m.state_dict(consumed=k * 6) if num_workers else m.state_dict()
    assert state["epoch"] == 1 and state["position"] == k * 6
    resumed = mix(paths, weights=[1, 2] + [1] * (N - 2), seed=4, batch_size=6, crop=24)
    resumed.load_state_dict(state)
    rest = collect(resumed, num_workers)
    assert len(rest) == len(full) - k
    assert all(torch.equal(a, b) and torch.equal(la, lb) for (a, la), (b, lb) in zip(full[k:], rest))
    with pytest.raises(ValueError, match="cannot resume"):
        mix(paths, weights=[1] * N, seed=4, batch_size=6).load_state_dict(state)


def test_resume_through_make_loader_with_persistent_workers(paths):
    def stream():
        return mix(paths, weights=[1, 2] + [1] * (N - 2), seed=4, batch_size=6, crop=24)

    def epochs(m, loader, which):
        out = []
        for epoch in which:
            m.set_epoch(epoch)
            out.append([labels.tolist() for _, labels in loader])
        return out

    m = stream()
    reference = epochs(m, make_loader(m, num_workers=2), (0, 1))
    m = stream()
    loader = make_loader(m, num_workers=2, persistent_workers=True)
    m.set_epoch(0)
    for taken, _ in enumerate(loader, 1):
        if taken == 3:
            break
    state = loader.state_dict()
    m = stream()
    loader = make_loader(m, num_workers=2, persistent_workers=True)
    loader.load_state_dict(state)
    assert epochs(m, loader, (0, 1)) == [reference[0][3:], reference[1]]


def test_bad_arguments_are_clear(paths, tmp_path):
    with pytest.raises(ValueError, match="one weight per dataset"):
        mix(paths, weights=[1] * (N - 1))
    with pytest.raises(ValueError, match="not all 0"):
        mix(paths, weights=[0] * N)
    with pytest.raises(ValueError, match="labels='nope'"):
        mix(paths, labels="nope")
    renamed = tmp_path / "renamed"
    shutil.copytree(paths[-1], renamed)
    manifest = json.loads((renamed / "manifest.json").read_text())
    manifest["classes"][0] = "something else"
    (renamed / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="identical classes"):
        mix([paths[0], renamed], labels="shared")
    assert mix([paths[0], renamed]).classes[len(manifest["classes"])] == "1:something else"
