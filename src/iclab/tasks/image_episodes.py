"""Few-shot classification episodes from a fixed feature array (Wang et al. 2025, §6.2, offline substitute).

The paper's in-context ImageNet task: pick ``ways`` = 5 distinct classes, ``shots`` = 10 images of each
(N = 50 context pairs), and one more image of one of the 5 classes as the query; labels 0..4 are a
fresh random permutation of the 5 classes in every episode, and the context order is shuffled. The
covariates are frozen VGG16 features (d = 512) and training and test episodes use disjoint classes
(900 / 100).

:class:`FeatureEpisodes` implements that protocol for *any* (N, F) feature array with N integer labels,
so real features (e.g. ImageNet VGG16 features, N × 512) plug in unchanged::

    train = FeatureEpisodes(feats, labels, ways=5, shots=10, classes=train_classes)
    ep = train.sample(2048, 50, generator=iclab.generator(0))   # x (2048, 50, 512), labels in [0, 5)

:func:`digits_episodes` is the offline stand-in used by the experiments: scikit-learn's bundled
8×8 digits (1797 images, ≥ 174 per class; no download), classes 0–4 for training episodes and 5–9
for test episodes, features from a fixed seeded extractor (:func:`digits_features`).

Departures from the authors' code (docs/errata.md): the query class is uniform over the episode's
classes (their torch ``ImageNet`` dataset always gives the query the label C − 1, a label leak), the
query image is never one of the context images, and every draw uses the caller's generator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import torch
from torch import Tensor

from iclab.core.episode import Episode
from iclab.core.errors import require, require_int
from iclab.core.seeding import derive_seed, generator

#: Disjoint class splits of the digits stand-in, as the paper's 900 training and 100 test ImageNet classes
#: (Wang et al. 2025, §6.2).
DIGITS_TRAIN_CLASSES = (0, 1, 2, 3, 4)
DIGITS_TEST_CLASSES = (5, 6, 7, 8, 9)


@dataclass(frozen=True, eq=False)
class FeatureEpisodes:
    """``ways``-way ``shots``-shot episodes over the classes ``classes`` of a feature array.

    Args:
        features: (N, F) float array or tensor, one feature vector per example (kept in float64 on CPU;
            :meth:`sample` moves it to the generator's device and dtype once and caches it).
        labels: (N,) integer class ids >= 0.
        ways: classes per episode (C of the episode); labels are in [0, ways).
        shots: context examples per class; an episode has n = ways·shots context pairs.
        classes: the class ids episodes are drawn from (e.g. the training split); None = every id in
            ``labels``. Each needs at least shots + 1 examples (the query is an extra example).

    ``task['classes'] (B, ways)``: the original class id behind each episode label (per prompt).
    """

    features: Tensor | np.ndarray
    labels: Tensor | np.ndarray
    ways: int = 5
    shots: int = 10
    classes: Sequence[int] | Tensor | None = None
    _cache: dict[object, Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        feats = self.features if isinstance(self.features, Tensor) else torch.from_numpy(np.array(self.features))
        labels = self.labels if isinstance(self.labels, Tensor) else torch.from_numpy(np.array(self.labels))
        require(self, "features", feats.dim() == 2, "an (N, F) array", f"shape {tuple(feats.shape)}")
        require(self, "features", feats.is_floating_point(), "a float array", feats.dtype)
        require(self, "features", feats.shape[0] >= 1 and feats.shape[1] >= 1, "non-empty", tuple(feats.shape))
        require(self, "features", bool(torch.isfinite(feats).all()), "finite", "non-finite entries")
        require(self, "labels", labels.dim() == 1, "a 1-D array of N labels", f"shape {tuple(labels.shape)}")
        require(
            self,
            "labels",
            labels.shape[0] == feats.shape[0],
            f"one label per feature row (N = {feats.shape[0]})",
            f"{labels.shape[0]} labels",
        )
        require(self, "labels", not labels.dtype.is_floating_point and labels.dtype != torch.bool, "integers",
                labels.dtype)  # fmt: skip
        labels = labels.long()
        require(self, "labels", int(labels.min()) >= 0, "class ids >= 0", f"min {int(labels.min())}")
        require_int(self, "ways", self.ways, 2)
        require_int(self, "shots", self.shots, 1)
        present = torch.unique(labels)
        classes = present if self.classes is None else torch.as_tensor(list(self.classes), dtype=torch.long).unique()
        missing = sorted(set(classes.tolist()) - set(present.tolist()))
        require(self, "classes", not missing, "class ids that occur in labels", f"ids {missing} not in labels")
        require(
            self,
            "classes",
            classes.numel() >= self.ways,
            f"at least ways = {self.ways} classes",
            f"{classes.numel()} classes",
        )
        counts = torch.stack([(labels == c).sum() for c in classes])  # (K,)
        short = {int(c): int(k) for c, k in zip(classes, counts) if int(k) < self.shots + 1}
        require(
            self,
            "shots",
            not short,
            f"an int <= (examples per class) − 1, the query being an extra example (class: count {short})",
        )
        table = torch.full((classes.numel(), int(counts.max())), -1, dtype=torch.long)  # (K, max count)
        for i, c in enumerate(classes.tolist()):
            idx = torch.nonzero(labels == c).reshape(-1)
            table[i, : idx.numel()] = idx
        object.__setattr__(self, "features", feats.detach().to("cpu", torch.float64))
        object.__setattr__(self, "labels", labels.cpu())
        object.__setattr__(self, "classes", classes)
        self._cache["table"], self._cache["counts"] = table, counts

    @property
    def n(self) -> int:
        """Context pairs per episode: ways · shots."""
        return self.ways * self.shots

    @property
    def feature_dim(self) -> int:
        """Width of one feature vector."""
        return self.features.shape[1]

    def _on(self, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        key = (str(device), dtype)
        if key not in self._cache:
            self._cache[key] = (
                cast(Tensor, self.features).to(device, dtype),  # __post_init__ made features and classes tensors
                self._cache["table"].to(device),
                self._cache["counts"].to(device),
                cast(Tensor, self.classes).to(device),
            )
        out: tuple[Tensor, Tensor, Tensor, Tensor] = self._cache[key]
        return out

    def sample(
        self, batch: int, n: int | None = None, *, generator: torch.Generator, dtype: torch.dtype = torch.float32
    ) -> Episode:
        """``batch`` episodes on ``generator.device``; ``n`` (optional, the Task signature) must equal ways·shots."""
        require_int(self, "batch", batch, 1)
        require(self, "n", n is None or n == self.n, f"None or ways·shots = {self.n}", n)
        dev = generator.device
        feats, table, _counts, classes = self._on(dev, dtype)
        B, W, S, K = batch, self.ways, self.shots, classes.numel()
        chosen = torch.rand(B, K, generator=generator, device=dev, dtype=torch.float64).argsort(1)[:, :W]  # (B, W)
        keys = torch.rand(B, W, table.shape[1], generator=generator, device=dev, dtype=torch.float64)
        keys = keys.masked_fill(table[chosen] < 0, 2.0)  # padding sorts last
        picks = table[chosen].gather(2, keys.argsort(-1)[..., : S + 1])  # (B, W, S+1) example ids, distinct
        perm = torch.rand(B, W, generator=generator, device=dev, dtype=torch.float64).argsort(1)  # label of way w
        q_way = torch.randint(0, W, (B,), generator=generator, device=dev)  # (B,)
        order = torch.rand(B, W * S, generator=generator, device=dev, dtype=torch.float64).argsort(1)  # shuffle

        ctx = picks[:, :, :S].reshape(B, W * S).gather(1, order)  # (B, n) example ids
        ctx_labels = perm.repeat_interleave(S, dim=1).gather(1, order)  # (B, n) in [0, W)
        rows = torch.arange(B, device=dev)
        query = picks[rows, q_way, S]  # (B,)
        by_label = torch.empty_like(chosen).scatter_(1, perm, classes[chosen])  # (B, W): class id of label j
        return Episode(
            x=feats[ctx],
            x_query=feats[query],
            labels=ctx_labels,
            label_query=perm[rows, q_way],
            task={"classes": by_label},
            batched=("classes",),
        )


def _extract(pixels: np.ndarray, extractor: str, width: int, seed: int, train_rows: np.ndarray) -> np.ndarray:
    z = torch.as_tensor(pixels / 8.0 - 1.0)  # (N, 64) grey levels 0..16 -> [−1, 1]
    if extractor == "random_relu":
        g = generator(derive_seed(seed, "digits-extractor"))
        w = torch.randn(z.shape[1], width, generator=g, dtype=torch.float64) / z.shape[1] ** 0.5
        b = torch.rand(width, generator=g, dtype=torch.float64) * 2 - 1
        z = torch.relu(z @ w + b)  # (N, width)
    mean, std = z[train_rows].mean(0), z[train_rows].std(0)
    return ((z - mean) / torch.where(std > 1e-8, std, torch.ones_like(std))).numpy()


def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits, (1797, 64) grey levels 0..16 and (1797,) labels.

    Reads the CSV that ships inside the scikit-learn wheel directly (what ``load_digits`` reads),
    which skips the multi-second ``sklearn`` import; falls back to ``load_digits`` if the file moved.
    """
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    locations = spec.submodule_search_locations if spec is not None else None
    path = Path(next(iter(locations))) / "datasets" / "data" / "digits.csv.gz" if locations else None
    if path is not None and path.exists():
        table = np.loadtxt(path, delimiter=",")
        return table[:, :-1].astype(np.float64), table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    data = load_digits()
    return data.data.astype(np.float64), data.target.astype(np.int64)


@lru_cache(maxsize=8)
def digits_features(
    extractor: Literal["random_relu", "pixels"] = "random_relu", width: int = 256, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels of scikit-learn's bundled digits: ``(1797, F)`` float64, ``(1797,)`` int64.

    The fixed seeded extractor standing in for a frozen VGG16:

    * ``'random_relu'`` (default): φ(x) = ReLU(W z + b), z = pixels/8 − 1 ∈ [−1, 1]^64, W ∈ R^{64×F}
      iid N(0, 1/64), b iid U[−1, 1], drawn from ``derive_seed(seed, 'digits-extractor')``; F = ``width``.
    * ``'pixels'``: z itself (F = 64).

    Every feature is then standardised with the mean and std over the *training* classes' images
    (classes 0–4), so no statistic of the test classes enters the extractor.
    """
    require("digits_features", "extractor", extractor in ("random_relu", "pixels"), "'random_relu' or 'pixels'",
            extractor)  # fmt: skip
    require_int("digits_features", "width", width, 1)
    pixels, labels = _load_digits()
    train_rows = np.isin(labels, DIGITS_TRAIN_CLASSES)
    feats = _extract(pixels, extractor, width, seed, train_rows)
    feats.setflags(write=False)
    labels.setflags(write=False)
    return feats, labels


def digits_episodes(
    split: Literal["train", "test"] = "train",
    *,
    ways: int = 5,
    shots: int = 10,
    extractor: Literal["random_relu", "pixels"] = "random_relu",
    width: int = 256,
    seed: int = 0,
) -> FeatureEpisodes:
    """5-way 10-shot digits episodes on the training classes 0–4 or the held-out test classes 5–9.

    With 5 classes per split and ``ways = 5`` every episode holds all classes of its split; what varies
    is the images, the label permutation, the query class and the order.
    """
    require("digits_episodes", "split", split in ("train", "test"), "'train' or 'test'", split)
    feats, labels = digits_features(extractor, width, seed)
    classes = DIGITS_TRAIN_CLASSES if split == "train" else DIGITS_TEST_CLASSES
    return FeatureEpisodes(feats, labels, ways=ways, shots=shots, classes=classes)


def feature_file_episodes(
    path: str | Path, *, ways: int = 5, shots: int = 10, test_fraction: float = 0.1
) -> tuple[FeatureEpisodes, FeatureEpisodes]:
    """Training and test episodes from a user's own feature file, e.g. real ImageNet VGG16 features (N × 512).

    ``path`` is an ``.npz`` holding ``features`` (N, F) and ``labels`` (N,), and optionally ``train_classes`` and
    ``test_classes`` (disjoint class ids). Without them the classes are split by id: the largest
    ⌈test_fraction · #classes⌉ ids are the test classes (the paper's 900 / 100 split of ImageNet at 0.1).
    Returns ``(train, test)``; every check of :class:`FeatureEpisodes` applies to both.
    """
    owner = "feature_file_episodes"
    path = Path(path)
    require(owner, "path", path.is_file(), "an existing .npz file", str(path))
    require(owner, "test_fraction", 0 < test_fraction < 1, "a float in (0, 1)", test_fraction)
    with np.load(path, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    missing = [k for k in ("features", "labels") if k not in arrays]
    require(owner, "path", not missing, "an .npz with arrays 'features' (N, F) and 'labels' (N,)",
            f"{path.name} without {missing} (arrays: {sorted(arrays)})")  # fmt: skip
    labels = np.asarray(arrays["labels"])
    if "train_classes" in arrays or "test_classes" in arrays:
        require(owner, "path", "train_classes" in arrays and "test_classes" in arrays,
                "both 'train_classes' and 'test_classes', or neither", sorted(arrays))  # fmt: skip
        train_c, test_c = (sorted(int(c) for c in np.asarray(arrays[k]).ravel()) for k in ("train_classes", "test_classes"))  # fmt: skip
    else:
        ids = sorted(int(c) for c in np.unique(labels))
        k = math.ceil(test_fraction * len(ids))
        require(owner, "labels", len(ids) - k >= 1, "at least two classes (one to train on, one to test)",
                f"{len(ids)} class(es)")  # fmt: skip
        train_c, test_c = ids[: len(ids) - k], ids[len(ids) - k :]
    both = sorted(set(train_c) & set(test_c))
    require(owner, "test_classes", not both, "disjoint from train_classes", f"shared ids {both}")
    train = FeatureEpisodes(arrays["features"], labels, ways=ways, shots=shots, classes=train_c)
    test = FeatureEpisodes(arrays["features"], labels, ways=ways, shots=shots, classes=test_c)
    return train, test
