"""``import eagle_kernels`` and the torch backend work where triton is not installed (issue 13 e).

A subprocess blocks ``import triton`` (``sys.modules["triton"] = None`` makes every import of
it raise ImportError, as on a machine without the package), then imports eagle_kernels, runs
ops on the torch backend and checks what the report and an explicit triton request say.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

NO_TRITON = textwrap.dedent('''
    import sys
    for name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
        del sys.modules[name]
    sys.modules["triton"] = None  # any "import triton" now raises ImportError
    import torch
    import eagle_kernels
    from eagle_kernels import ops
    assert "triton" not in [m for m in sys.modules if sys.modules[m] is not None]

    parents = torch.tensor([[-1, 0, 0, 1]], dtype=torch.int32)
    depth, mask, paths = ops.build_tree(parents)  # auto: torch
    assert depth.tolist() == [[0, 1, 1, 2]], depth
    values, ids = ops.topk_log_softmax(torch.randn(2, 16), 3, backend="torch")
    assert ids.shape == (2, 3)
    status = ops.available_backends()["triton"]
    assert not status.available and status.reason == "triton is not installed", status
    report = eagle_kernels.backend_report()
    assert "triton is not installed" in report, report
    try:
        ops.build_tree(parents, backend="triton")
    except ValueError as error:
        assert "triton is not installed" in str(error), error
    else:
        raise AssertionError("backend='triton' without triton did not raise")
    from eagle_kernels.ops import _backend
    print("digest", _backend.source_digest("topk_log_softmax", "triton"))
    print("no-triton ok")
''')


def test_import_and_torch_backend_without_triton():
    env = dict(os.environ, TRITON_INTERPRET="1")  # even asked to interpret, triton is absent
    env.pop("EAGLE_KERNELS_BACKEND", None)
    run = subprocess.run([sys.executable, "-c", NO_TRITON], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "no-triton ok" in run.stdout, (
        f"exit {run.returncode}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr[-4000:]}")
    # the kernels' source digest is read from their Python source: the same without Triton
    from eagle_kernels.ops._backend import source_digest
    assert f"digest {source_digest('topk_log_softmax', 'triton')}\n" in run.stdout, run.stdout
