"""SIMT matmul tiles that overhang the problem (M, N or K not a multiple of the tile): the k loop's interior
iterations run a copy of the unrolled nest without bounds checks, the edges keep them, and a double-buffered
copy guards its loads only.  Emulated against the reference, compiled without spills, and the source read
for the two versions."""

from __future__ import annotations

import re

import numpy as np
import pytest

import schedlib as sl
from schedlib import workloads as wl
from schedlib.codegen.loop_versioning import _corner
from schedlib.ir.expr import Const, Load, Var
from schedlib.rules import get_rule

from .helpers import check_resources, check_schedule

MATMUL = get_rule("matmul")
H100 = sl.hw.load("h100")
SIMT = {"block_m": 32, "block_n": 32, "block_k": 16, "thread_m": 4, "thread_n": 4, "vector": 4, "split_k": 1,
        "stages": 2, "tensor_core": False, "raster": 1}


def versions(source: str) -> tuple[str, str, str]:
    """(test, interior nest, edge nest) of the one versioned loop in ``source``."""
    edge = re.search(r"\n( *)else \{\n", source)
    assert edge, "no versioned nest"
    indent = edge.group(1)
    head = source.rindex(f"\n{indent}if (", 0, edge.start())
    test = source[head:].split("\n")[1].strip()[len("if ("):-len(") {")]
    end = source.index(f"\n{indent}}}\n", edge.end())
    assert len(re.findall(r"\n *else \{\n", source)) == 1
    return test, source[head:edge.start()].split("\n", 2)[2], source[edge.end():end]


@pytest.mark.parametrize(("shape", "config"), [
    ((40, 36, 72, {}), SIMT),  # every side ragged, double-buffered
    ((100, 36, 72, {"epilogue": "bias_relu"}), {**SIMT, "stages": 1, "vector": 1}),  # one buffer
    ((64, 40, 999, {"trans_a": True}), {**SIMT, "split_k": 2}),  # the k check is a select in the slices
], ids=["double-buffered", "one-buffer", "split-k"])
def test_ragged_tiles_run_an_unchecked_interior(shape: tuple, config: dict, rng: np.random.Generator) -> None:
    m, n, k, kw = shape
    f = wl.matmul(m, n, k, **kw)
    kernel = check_schedule(f, MATMUL.apply(f, H100, config), rng)
    test, interior, edge = versions(kernel.source)
    assert f"{config['block_k'] - 1}) < {k})" in test  # the k step's last column is inside K
    assert not re.search(r"C(_rf)?_[ij]_1\b", test)  # threads' rows and columns: the block's corner decides
    assert "if (" not in interior and "?" not in interior  # no check left inside the interior nest
    assert f"< {k})" in edge  # the edge keeps them, one k step at a time (rolled: fewer predicates live)
    assert edge.lstrip().startswith("#pragma unroll 1\n")
    assert interior.count("+=") == edge.count("+=") and interior.count("* ") <= edge.count("* ")


def test_double_buffered_copies_guard_their_loads_only(rng: np.random.Generator) -> None:
    """The register array starts zeroed and fills every slot of the tile: a store guarded as its load kept
    one predicate per prefetched value alive across the loop body."""
    f = wl.matmul(40, 36, 72)
    source = sl.build(MATMUL.apply(f, H100, SIMT), "h100").source
    lines = source[source.index("for (int C_k_0 = 0"):].split("\n")
    assert "float sl_pf_A_shared[8] = {};" in lines[2] and "uint4 sl_pf_B_shared[2] = {};" in source
    stores = [i for i, line in enumerate(lines) if "sl_nxt *" in line]
    assert len(stores) == 2  # A's scalar copy and B's 4-wide one, both into the other slot
    for i in stores:
        assert "if (" not in lines[i] and "if (" not in lines[i - 1] and "if (" not in lines[i - 2], lines[i - 2:i + 1]
    loads = [line for line in lines if "= SL_VLOAD" in line or re.search(r"sl_pf_A_shared\[.*\] = A\[", line)]
    assert len(loads) == 2
    guards = [lines[lines.index(line) - 1] if "if (" not in line else line for line in loads]
    assert all("< 72)" in g for g in guards)  # the loads stay inside K


def test_tiles_that_fit_are_not_versioned() -> None:
    source = sl.build(MATMUL.apply(wl.matmul(64, 64, 64), H100, SIMT), "h100").source
    assert not re.search(r"\n *else \{\n", source) and "= {};" not in source


def test_a_ragged_k_tile_compiles_without_spills(cuda_compiler: None) -> None:
    """Regression: a double-buffered 32 x 32 x 32 fp32 tile over K = 8191 spilled 8 bytes on sm_90, the
    unrolled nest's k checks live together."""
    f = wl.matmul(24, 33, 8191)
    config = {**MATMUL.default_config(f, H100), "block_k": 32, "stages": 2, "split_k": 1}
    assert (config["block_m"], config["block_n"], config["thread_m"], config["thread_n"]) == (32, 32, 4, 4)
    check_resources(sl.build(MATMUL.apply(f, H100, config), "h100"))


def test_only_affine_checks_on_the_nest_are_hoisted() -> None:
    k0, k1, i, t = Var("k0"), Var("k1"), Var("i"), Var("t")
    inner = {"k1": 32, "i": 4}
    assert str(_corner(k0 * 32 + k1 < 100, inner)) == str((k0 * 32 + 31) < 100)
    assert str(_corner(k0 * 8 - i >= 3, inner)) == str((k0 * 8 - 3) >= 3)  # i's worst value is its largest
    assert str(_corner(t - k1 > 0, inner)) == str((t - 31) > 0)
    assert _corner(k0 * 32 < 100, inner) is None  # one value over the nest: nothing to version
    assert _corner((k0 * 32 + k1) // 3 < 100, inner) is None  # not affine in k1
    assert _corner(k0 * 32 + k1 * i < 100, inner) is None  # a product of two inner loops
    assert _corner(Const(1.5) < Var("x", "float32"), inner) is None  # not an index comparison
    assert _corner(k0 * 32 + k1 < Load("L", (t,), "int32", None), inner) is None  # reads memory
    assert _corner(k0 * 32 + k1 < t // Var("d"), inner) is None  # may divide by zero
