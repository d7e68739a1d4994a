"""Few-shot feature episodes (Wang et al. 2025 §6.2 protocol) and the digits stand-in for ImageNet."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import iclab
from iclab.core.errors import ConfigError
from iclab.tasks.image_episodes import (
    DIGITS_TEST_CLASSES,
    DIGITS_TRAIN_CLASSES,
    FeatureEpisodes,
    _load_digits,
    digits_episodes,
    digits_features,
    feature_file_episodes,
)


def _indexed(num_classes: int = 12, per_class: int = 15) -> tuple[torch.Tensor, torch.Tensor]:
    """Features that name their own row (feature 0 = row id) so episodes can be traced back to the data."""
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    labels = labels[torch.randperm(labels.numel(), generator=iclab.generator(0))]
    feats = torch.stack(
        [
            torch.arange(labels.numel(), dtype=torch.float64),
            torch.randn(labels.numel(), generator=iclab.generator(1), dtype=torch.float64),
        ],
        1,
    )
    return feats, labels


def test_episodes_are_ways_shots_with_permuted_labels() -> None:
    feats, labels = _indexed()
    task = FeatureEpisodes(feats, labels, ways=5, shots=10, classes=range(8))
    ep = task.sample(400, 50, generator=iclab.generator(2), dtype=torch.float64)
    assert ep.x.shape == (400, 50, 2) and ep.x_query.shape == (400, 2) and ep.labels.dtype == torch.int64
    # every label 0..4 appears exactly `shots` times per episode
    counts = torch.nn.functional.one_hot(ep.labels, 5).sum(1)
    assert bool((counts == 10).all())
    rows = ep.x[..., 0].long()  # (B, n) dataset rows
    qrows = ep.x_query[:, 0].long()
    by_label = ep.task["classes"]  # (B, 5) class behind each label
    assert torch.equal(labels[rows], by_label.gather(1, ep.labels))  # context label ↔ its class
    assert torch.equal(labels[qrows], by_label.gather(1, ep.label_query[:, None])[:, 0])  # query too
    assert bool((rows.sort(1).values.diff(dim=1) > 0).all())  # context images distinct
    assert not bool((rows == qrows[:, None]).any())  # the query is not a context image
    assert set(by_label.unique().tolist()) <= set(range(8))
    assert all(len(set(r.tolist())) == 5 for r in by_label)
    # the label → class map is a fresh permutation per episode: each class lands on each label ~1/5 of the time
    one_class = (by_label == by_label[0, 0]).float()  # where class by_label[0,0] sits, when present
    present = one_class.sum(1) == 1
    freq = one_class[present].mean(0)
    assert float((freq - 0.2).abs().max()) < 0.1, freq
    # the query label is uniform over 0..4 (the authors' loader always gives label C − 1)
    qfreq = torch.bincount(ep.label_query, minlength=5).double() / 400
    assert float((qfreq - 0.2).abs().max()) < 0.07, qfreq
    # context order is shuffled: labels are not sorted
    assert not bool((ep.labels.diff(dim=1) >= 0).all(1).any())


def test_seeded_and_on_generator_dtype() -> None:
    feats, labels = _indexed()
    task = FeatureEpisodes(feats, labels, ways=3, shots=4)
    a = task.sample(6, generator=iclab.generator(5))
    b = task.sample(6, 12, generator=iclab.generator(5))
    assert torch.equal(a.x, b.x) and torch.equal(a.labels, b.labels) and a.x.dtype == torch.float32
    assert not torch.equal(a.x, task.sample(6, generator=iclab.generator(6)).x)


def test_digits_splits_are_disjoint_and_features_fixed() -> None:
    feats, labels = digits_features()
    assert feats.shape == (1797, 256) and labels.shape == (1797,)
    train_rows = np.isin(labels, DIGITS_TRAIN_CLASSES)
    np.testing.assert_allclose(feats[train_rows].mean(0), 0.0, atol=1e-10)  # standardised on train classes only
    again, _ = digits_features.__wrapped__()  # recompute without the cache: the extractor is seeded
    np.testing.assert_array_equal(feats, again)
    assert set(DIGITS_TRAIN_CLASSES).isdisjoint(DIGITS_TEST_CLASSES)
    tr = digits_episodes("train").sample(64, generator=iclab.generator(0))
    te = digits_episodes("test").sample(64, generator=iclab.generator(0))
    assert set(tr.task["classes"].unique().tolist()) == set(DIGITS_TRAIN_CLASSES)
    assert set(te.task["classes"].unique().tolist()) == set(DIGITS_TEST_CLASSES)
    assert tr.x.shape == (64, 50, 256) and int(tr.labels.max()) == 4
    px = digits_episodes("test", extractor="pixels").sample(2, generator=iclab.generator(0))
    assert px.x.shape == (2, 50, 64)


@pytest.mark.slow
def test_fast_digits_reader_equals_load_digits() -> None:
    """The CSV read skips the slow sklearn import (~6 s); it must return exactly what load_digits returns."""
    from sklearn.datasets import load_digits

    pixels, labels = _load_digits()
    ref = load_digits()
    np.testing.assert_array_equal(pixels, ref.data)
    np.testing.assert_array_equal(labels, ref.target)


def test_user_features_plug_in_unchanged() -> None:
    """An ImageNet-like array (N × 512, 100 classes, 900/100 style split) goes through the same loader."""
    g = iclab.generator(3)
    labels = torch.randint(0, 100, (3000,), generator=g)
    feats = np.random.default_rng(0).standard_normal((3000, 512)).astype(np.float32)
    task = FeatureEpisodes(feats, labels.numpy(), ways=5, shots=10, classes=range(90))
    ep = task.sample(8, 50, generator=g)
    assert ep.x.shape == (8, 50, 512) and int(ep.task["classes"].max()) < 90


def test_bad_input_is_named() -> None:
    feats, labels = _indexed()
    with pytest.raises(ConfigError, match=r"FeatureEpisodes\.features must be an \(N, F\) array; got 'shape \(180,\)'"):
        FeatureEpisodes(feats[:, 0], labels)
    with pytest.raises(
        ConfigError, match=r"FeatureEpisodes\.labels must be one label per feature row \(N = 180\); got '179 labels'"
    ):
        FeatureEpisodes(feats, labels[:-1])
    with pytest.raises(ConfigError, match=r"FeatureEpisodes\.labels must be class ids >= 0; got 'min -1'"):
        FeatureEpisodes(feats, labels - 1)
    with pytest.raises(ConfigError, match=r"FeatureEpisodes\.labels must be integers"):
        FeatureEpisodes(feats, labels.double())
    with pytest.raises(
        ConfigError, match=r"FeatureEpisodes\.classes must be at least ways = 5 classes; got '4 classes'"
    ):
        FeatureEpisodes(feats, labels, classes=[0, 1, 2, 3])
    with pytest.raises(
        ConfigError,
        match=r"FeatureEpisodes\.classes must be class ids that occur in labels; got 'ids \[99\] not in labels'",
    ):
        FeatureEpisodes(feats, labels, classes=[0, 1, 2, 3, 99])
    with pytest.raises(ConfigError, match=r"FeatureEpisodes\.shots must be .*class: count"):
        FeatureEpisodes(feats, labels, shots=15)
    with pytest.raises(ConfigError, match=r"FeatureEpisodes\.features must be a float array"):
        FeatureEpisodes(feats.long(), labels)
    with pytest.raises(ConfigError, match=r"FeatureEpisodes\.n must be None or ways·shots = 50; got 49"):
        FeatureEpisodes(feats, labels).sample(2, 49, generator=iclab.generator(0))
    with pytest.raises(ConfigError, match=r"digits_episodes\.split must be 'train' or 'test'; got 'val'"):
        digits_episodes("val")


@settings(max_examples=20, deadline=None)
@given(N=st.integers(1, 40), F=st.integers(1, 4), extra=st.integers(-3, 3), ways=st.integers(1, 6))
def test_shape_validation_property(N: int, F: int, extra: int, ways: int) -> None:
    """Any (features, labels, ways) that does not fit the episode spec is rejected before sampling."""
    feats = torch.randn(N, F, dtype=torch.float64)
    M = max(N + extra, 0)
    labels = torch.arange(M) % 3
    fits = (
        M == N
        and ways >= 2
        and N >= 1
        and ways <= min(3, N)
        and all(int((labels == c).sum()) >= 2 for c in range(min(3, N)))
    )
    if fits:
        ep = FeatureEpisodes(feats, labels, ways=ways, shots=1).sample(2, generator=iclab.generator(0))
        assert ep.labels.shape == (2, ways)
    else:
        with pytest.raises(ConfigError, match=r"FeatureEpisodes\.(labels|ways|classes|shots)"):
            FeatureEpisodes(feats, labels, ways=ways, shots=1)


def _feature_file(path, num_classes: int = 10, per_class: int = 12, F: int = 7, **extra) -> np.ndarray:
    labels = np.repeat(np.arange(num_classes), per_class)
    feats = np.random.default_rng(0).normal(size=(labels.size, F))
    np.savez(path, features=feats, labels=labels, **extra)
    return feats


def test_feature_file_episodes_split_classes_and_plug_in(tmp_path) -> None:
    """A user's .npz (say VGG16 features of ImageNet) gives disjoint train/test episodes: by id (the largest
    ⌈0.1·K⌉ ids test, the paper's 900 / 100) or by the file's own class lists; episodes carry the file's rows."""
    feats = _feature_file(tmp_path / "f.npz", num_classes=20)
    train, test = feature_file_episodes(tmp_path / "f.npz", ways=2, shots=3)
    assert train.classes.tolist() == list(range(18)) and test.classes.tolist() == [18, 19]
    feats = _feature_file(tmp_path / "g.npz")
    np.savez(
        tmp_path / "g.npz",
        **dict(np.load(tmp_path / "g.npz")),
        train_classes=[0, 1, 2, 3, 4],
        test_classes=[5, 6, 7, 8, 9],
    )
    train, test = feature_file_episodes(tmp_path / "g.npz", ways=5, shots=10)
    ep = test.sample(4, 50, generator=iclab.generator(0), dtype=torch.float64)
    assert ep.x.shape == (4, 50, 7) and set(ep.task["classes"].flatten().tolist()) <= {5, 6, 7, 8, 9}
    rows = torch.from_numpy(feats)
    assert all(bool((rows == v).all(-1).any()) for v in ep.x.reshape(-1, 7))  # every context row is a file row


def test_feature_file_errors_name_the_problem(tmp_path) -> None:
    with pytest.raises(ConfigError, match="feature_file_episodes.path must be an existing .npz file"):
        feature_file_episodes(tmp_path / "missing.npz")
    np.savez(tmp_path / "nolabels.npz", features=np.zeros((3, 2)))
    with pytest.raises(ConfigError, match=r"arrays 'features' \(N, F\) and 'labels' \(N,\); got .*\['labels'\]"):
        feature_file_episodes(tmp_path / "nolabels.npz")
    _feature_file(tmp_path / "overlap.npz", train_classes=[0, 1, 2], test_classes=[2, 3])
    with pytest.raises(ConfigError, match=r"test_classes must be disjoint from train_classes; got 'shared ids \[2\]'"):
        feature_file_episodes(tmp_path / "overlap.npz", ways=2, shots=3)
    _feature_file(tmp_path / "half.npz", train_classes=[0, 1])
    with pytest.raises(ConfigError, match="both 'train_classes' and 'test_classes', or neither"):
        feature_file_episodes(tmp_path / "half.npz")
    _feature_file(tmp_path / "few.npz", per_class=5)
    with pytest.raises(ConfigError, match="FeatureEpisodes.shots must be an int <= .examples per class. − 1"):
        feature_file_episodes(tmp_path / "few.npz", ways=2, shots=10)
