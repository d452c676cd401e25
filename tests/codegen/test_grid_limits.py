"""Grids past CUDA's 65535 blocks along y and z.

The SIMT kernels launch at most 65535 blocks there and stride over the rest when the extent is known to
exceed it (a batch of 70,000 small matrices, the batch of a batched transpose); the tensor-core templates,
which give every matrix its own blockIdx.z, leave a batch that large to the SIMT template.  A symbolic
extent past the limit is refused at launch with the shapes that caused it.  The kernels run on the CPU
emulator, which enforces the limits.
"""

from __future__ import annotations

import numpy as np
import pytest

import schedlib as sl
from schedlib.errors import ShapeError

BATCH = 70_000


def test_a_batch_past_the_limit_strides_over_z() -> None:
    f = sl.workloads.matmul(9, 9, 2, batch=BATCH)
    kernel = sl.build(sl.rules.apply_default(f, "h100"), "h100")
    assert kernel.launch[0].grid_for({}) == (1, 1, 65535)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((BATCH, 9, 2), np.float32), rng.standard_normal((BATCH, 2, 9), np.float32)
    np.testing.assert_allclose(kernel.run_cpu(a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_a_symbolic_batch_is_bound_directly_and_refused_past_the_limit() -> None:
    """A symbolic extent keeps the plain blockIdx.z binding (a grid-stride loop in every kernel costs
    registers); a batch past the limit is refused at launch, naming the shapes."""
    f = sl.workloads.matmul(9, 9, 2, batch=sl.var("nb"))
    kernel = sl.build(sl.rules.apply_default(f, "h100"), "h100")
    assert "gridDim.z" not in kernel.source
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((65535, 9, 2), np.float32), rng.standard_normal((65535, 2, 9), np.float32)
    np.testing.assert_allclose(kernel.run_cpu(a, b), a @ b, rtol=1e-5, atol=1e-5)
    a, b = np.zeros((BATCH, 9, 2), np.float32), np.zeros((BATCH, 2, 9), np.float32)
    with pytest.raises(ShapeError, match=r"grid \(1, 1, 70000\) at nb=70000 exceeds CUDA's limits"):
        kernel.run_cpu(a, b)


def test_a_batched_transpose_past_the_limit() -> None:
    X = sl.placeholder((BATCH, 2, 3), "float32", "X")
    f = sl.func([X, sl.compute((BATCH, 3, 2), lambda n, i, j: X[n, j, i], "Y")], "batched_transpose")
    schedule = sl.rules.apply_default(f, "h100")
    assert schedule.rule == "transpose"
    x = np.random.default_rng(2).standard_normal((BATCH, 2, 3)).astype(np.float32)
    np.testing.assert_array_equal(sl.build(schedule, "h100").run_cpu(x), x.transpose(0, 2, 1))


def test_tensor_cores_leave_a_batch_past_the_limit_to_the_simt_template() -> None:
    f = sl.workloads.matmul(16, 16, 16, "float16", batch=65536)
    space = sl.rules.get_rule("matmul").space(f, sl.hw.load("h100"))
    assert dict((k.name, k.values) for k in space.knobs)["tensor_core"] == (False,)
    small = sl.workloads.matmul(16, 16, 16, "float16", batch=65535)
    assert sl.rules.get_rule("matmul").default_config(small, sl.hw.load("h100"))["tensor_core"] == "wgmma_tma"


def test_a_symbolic_batch_past_a_tensor_core_kernels_limit_is_refused_by_name() -> None:
    f = sl.workloads.matmul(16, 16, 16, "float16", batch=sl.var("nb"))
    kernel = sl.build(sl.rules.apply_default(f, "h100"), "h100")
    a = np.zeros((BATCH, 16, 16), np.float16)
    with pytest.raises(ShapeError, match=r"grid \(1, 1, 70000\) at nb=70000 exceeds CUDA's limits"):
        kernel.run_cpu(a, a)


def test_tensor_core_configs_with_more_block_rows_than_the_grid_holds_are_illegal() -> None:
    """Found by reading: the tensor-core kernels put block rows on blockIdx.y without striding, so 2^23 rows
    of 128 would have built a kernel that cannot launch."""
    f = sl.workloads.matmul(2**23, 16, 16, "float16")
    h100 = sl.hw.load("h100")
    rule = sl.rules.get_rule("matmul")
    space = rule.space(f, h100)
    default = rule.default_config(f, h100)
    assert default["tensor_core"] is False
    for template in ("wgmma_tma", True):
        reason = space.reason({**default, "tensor_core": template, "block_m": 128})
        assert reason == "65536 block rows exceed the grid's 65535 along y", reason
    kernel = sl.build(rule.apply(f, h100, default), h100)
    assert kernel.launch[0].grid_for({})[1] == 65535 and "gridDim.y" in kernel.source
