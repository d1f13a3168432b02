"""The target-output cache (target_cache.py): a stored file counts only for the example it was
computed from (its digest in the file's metadata), not because it exists."""

from __future__ import annotations

import shutil

import pytest
import torch

from eagle_kernels.runtime import training
from eagle_kernels.target_cache import TargetCache, example_digest
from runtime_helpers import tiny_target

FEATURE_LAYERS = (1, 3, 5)


@pytest.fixture(scope="module")
def target():
    model = tiny_target(seed=30)
    model.requires_grad_(False)
    return model


def examples_of(target, lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, target.vocab_size, (n,), generator=gen),
             torch.ones(n, dtype=torch.bool)) for n in lengths]


def new_cache(directory, target):
    return TargetCache(directory, target, FEATURE_LAYERS, ["test"], torch.arange(64))


def fresh_features(target, ids):
    _, features = training.target_pass(target, ids[None], FEATURE_LAYERS)
    return features[0]


def test_example_digest_is_length_and_content():
    ids = torch.tensor([5, 6, 7])
    assert example_digest(ids) == example_digest(ids.clone())
    assert example_digest(ids) != example_digest(torch.tensor([5, 7, 6]))
    assert example_digest(ids).startswith("3:")
    assert example_digest(ids) != example_digest(torch.tensor([5, 6, 7, 0]))


def test_files_of_other_examples_are_recomputed_under_the_same_key(tmp_path, target):
    """Regression: a file counted as filled because it existed, so examples that changed
    without the key changing (or another run's files) were read as if they were these."""
    examples = examples_of(target, [9, 12, 7], seed=0)
    new_cache(tmp_path, target).fill(examples, 64, 0, progress=False)
    changed = [examples[1], examples[0], examples_of(target, [7], seed=1)[0]]
    cache = new_cache(tmp_path, target)
    cache.fill(changed, 64, 0, progress=False)
    features, _, _ = cache.batch([0, 1, 2], 12)
    for row, (ids, _) in enumerate(changed):
        torch.testing.assert_close(features[row, :ids.numel()], fresh_features(target, ids),
                                   rtol=1e-5, atol=1e-5)


def test_a_file_rewritten_after_fill_is_refused_on_load(tmp_path, target):
    examples = examples_of(target, [9, 9], seed=2)  # same length: only the content differs
    cache = new_cache(tmp_path, target)
    cache.fill(examples, 64, 0, progress=False)
    shutil.copy(cache._file(1), cache._file(0))  # what a run sharing the directory could do
    with pytest.raises(ValueError, match="target cache: .*000000.safetensors holds example 9:"):
        cache.batch([0], 9)
    cache.fill(examples, 64, 0, progress=False)  # a fill recomputes it
    cache.batch([0, 1], 9)
    with pytest.raises(ValueError, match="example 5 was not filled"):
        cache.batch([5], 9)
