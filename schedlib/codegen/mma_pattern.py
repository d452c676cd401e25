"""Proof that a block annotated ``tensor_core="m16n8k16"`` (or ``"wgmma"``) is a warp-tiled ``acc += A * B`` the
mma lowering may replace, and the facts the emitter needs (:class:`MmaPlan`).

The annotation is a request, not a promise, so the loop nest is checked before anything is emitted.  The
main block must reduce ``float32(A_s[...]) * float32(B_s[...])`` with both operands 16-bit copies of global
inputs staged in shared memory at one k loop (``ko``), and its bindings must be exactly::

    m = by * BM + wy * WM + mt * 16 + h * 8 + lane // 4        (by: blockIdx.y, wy: threadIdx.z)
    n = bx * BN + wx * WN + nt * 8 + (lane % 4) * 2 + e        (bx: blockIdx.x, wx: threadIdx.y)
    k = ko * BK + kk * 16 + ki                                  (kk, ki, mt, h, nt, e serial, inside ko)

with ``lane`` bound to threadIdx.x (extent 32): then the elements a lane reduces are precisely those of the
mma.m16n8k16 accumulator fragments of its warp (groupID = lane // 4, threadID_in_group = lane % 4), and
replacing the serial loops under ``ko`` by ldmatrix + mma computes the same sums.  A split-K partial block
(``rfactor`` of the k loop cut into slices, see :mod:`schedlib.rules.matmul_split_k`) reads its operands at
``k + KS * s`` instead, with the slice ``s`` a spatial axis bound to blockIdx.z like a batch axis and ``KS``
the slice's k extent, a whole number of k steps: each block reduces its own slice.  Guards may only be the
bounds of m, n and k (the lowering zero-fills out-of-range tiles and guards the stores).  The write-back of
the accumulators, with any fused epilogue, is one spatial block attached after a loop outside ``ko``.

``"wgmma"`` asks for the same nest with warp tiles 16 rows tall: a Hopper warpgroup of 4 such warps stacked
along m holds exactly the accumulators of one ``wgmma.m64nNk16`` (N = the warp tile's width), so the nest is
the same proof; :mod:`schedlib.codegen.wgmma` checks the warpgroup shape on top.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedlib.errors import BuildError
from schedlib.ir.expr import Binary, Cast, Const, Expr, Load, Var, as_int
from schedlib.ir.func import Block, Buffer, Func
from schedlib.ir.simplify import conjuncts, free_vars, loads, simplify, to_affine

MMA_SHAPE = "m16n8k16"
INSTRUCTIONS = (MMA_SHAPE, "wgmma")  # values of the tensor_core annotation: mma.sync or Hopper warpgroup MMA
OPERAND_DTYPES = ("float16", "bfloat16")
COPY_ELEMENTS = 8  # one 16-byte cp.async
TAGS = {"by": "blockIdx.y", "bx": "blockIdx.x", "bz": "blockIdx.z", "wy": "threadIdx.z", "wx": "threadIdx.y",
        "lane": "threadIdx.x"}
# The serial loops of each axis inside ko: {coefficient: (extent or None for "the rest of the warp tile")}.
INNER = {"m": {8: 2, 16: None}, "n": {1: 2, 8: None}, "k": {1: 16, 16: None}}
OUTER = {"m": ("by", "wy"), "n": ("bx", "wx"), "k": ("ko", None)}  # block and warp loops of each axis


@dataclass(frozen=True)
class Operand:
    """One mma operand: the shared tile the main block reads and the global input it is copied from."""

    shared: Buffer
    source: Buffer
    roles: tuple[str, ...]  # per dimension, the main block's axis indexing it (batch axes first)

    @property
    def rows(self) -> str:
        return self.roles[-2]

    @property
    def cols(self) -> str:  # the contiguous dimension
        return self.roles[-1]


@dataclass(frozen=True)
class MmaPlan:
    main: Block
    writeback: Block
    dtype: str
    m: str
    n: str
    k: str
    batch: tuple[str, ...]
    a: Operand  # indexed by m and k
    b: Operand  # indexed by n and k
    tile: dict[str, int]  # block tile per axis (m, n, k)
    warp: tuple[int, int]  # warp tile (WM, WN)
    loops: dict[str, str]  # role (by, bx, bz, wy, wx, lane, ko) -> loop name
    stages: int
    raster: int
    wb_axes: dict[str, str]  # write-back axis -> main axis
    instruction: str = MMA_SHAPE  # one of INSTRUCTIONS
    k_slice: str | None = None  # split-K: the spatial axis whose slice of K (the k extent long) this block reduces

    def extent(self, axis: str) -> Expr:
        return self.main.axis(axis).extent


def fail(block: Block, why: str) -> None:
    what = dict(block.annotations).get("tensor_core", MMA_SHAPE)
    raise BuildError(f"block {block.name} is annotated tensor_core={what!r}, but {why}")


def _strip(e: Expr) -> Expr:
    while isinstance(e, Cast):
        e = e.value
    return e


def plan(func: Func, main: Block) -> MmaPlan:
    """Check ``main``'s loop nest (see the module docstring) and collect what the lowering needs."""
    instruction = dict(main.annotations).get("tensor_core")
    if instruction not in INSTRUCTIONS:
        fail(main, f"only {' and '.join(map(repr, INSTRUCTIONS))} are supported")
    if main.reducer != "sum" or main.init is None or main.kinds.count("R") != 1:
        fail(main, "it is not a single sum reduction with its init (schedule it before decompose_reduction)")
    acc = func.buffer(main.store)
    if acc.scope != "local" or acc.dtype != "float32":
        fail(main, f"it accumulates into {acc.scope} {acc.dtype} {acc.name}, not a local float32 cache_write")
    loops = {lp.name: lp for lp in main.loops}
    roles = {role: lp.name for lp in main.loops for role, tag in TAGS.items() if lp.thread == tag}
    for role in ("by", "bx", "wy", "wx", "lane"):
        if role not in roles:
            fail(main, f"no loop is bound to {TAGS[role]}")
    if as_int(loops[roles["lane"]].extent) != 32:
        fail(main, "its threadIdx.x loop (the lane) does not have extent 32")
    product = _strip(main.value)
    if not (isinstance(product, Binary) and product.op == "*"):
        fail(main, "its value is not a product")
    ops = [_strip(product.a), _strip(product.b)]
    if not all(isinstance(x, Load) and func.buffer(x.buffer).scope == "shared" for x in ops):
        fail(main, "its product is not of two shared-memory loads (cache_read both operands into shared)")
    copies = [_copy_of(func, main, x) for x in ops]  # type: ignore[arg-type]
    # mma multiplies exactly and adds in fp32: the IR must say float32(a) * float32(b), not a 16-bit product
    if not all(isinstance(x, Cast) and x.dtype == "float32" for x in (product.a, product.b)):
        fail(main, "its factors are not both cast to float32 before the multiply")
    ko = copies[0].attach.loop  # type: ignore[union-attr]
    if copies[1].attach.loop != ko:  # type: ignore[union-attr]
        fail(main, "its operands are staged at different loops")
    roles["ko"] = ko
    names = [lp.name for lp in main.loops]
    if any(names.index(roles[r]) > names.index(ko) for r in roles if r != "ko"):
        fail(main, f"a thread or block loop lies inside the k loop {ko}")
    ext = {n: as_int(lp.extent) for n, lp in loops.items()}
    inner = {n for n in names[names.index(ko) + 1:] if ext[n] != 1}
    axis_of, terms = _axes(main, roles, ext, inner)
    uses = [x for t in terms.values() for x in t if x in inner]
    stray = [n for n in names if n not in uses and n not in roles.values() and ext[n] != 1]
    if stray or len(uses) != len(set(uses)) or any(loops[n].thread for n in inner):
        fail(main, f"its serial loops {sorted(inner)} do not each step exactly one of m, n and k")
    tile, warp = _tiles(main, roles, ext, axis_of, terms)
    m, n, k = (axis_of[r] for r in ("m", "n", "k"))
    batch = tuple(a.name for a in main.axes if a.kind == "S" and a.name not in (m, n))
    for a, bnd in zip(main.axes, main.bindings):
        if a.name in batch and not free_vars(bnd) <= {roles.get("bz", "")}:
            fail(main, f"batch axis {a.name} is not bound to blockIdx.z alone")
    _check_guards(main)
    origin = {axis_of[r]: roles[blk] for r, (blk, _) in OUTER.items()}
    k_slice = _k_slice(main, ops, k, batch, tile)  # type: ignore[arg-type]
    operands = [_operand(func, main, x, c, origin, ext, tile, k_slice)  # type: ignore[arg-type]
                for x, c in zip(ops, copies)]
    a, b = sorted(operands, key=lambda o: n in o.roles)
    outer_dims = set(a.roles[:-2]) | set(b.roles[:-2])
    if set(a.roles[-2:]) != {m, k} or set(b.roles[-2:]) != {n, k} or outer_dims - set(batch):
        fail(main, f"its operands are indexed by {a.roles} and {b.roles}, not (batch.., m, k) and (batch.., n, k)")
    if a.source.dtype != b.source.dtype:
        fail(main, f"its operands are {a.source.dtype} and {b.source.dtype}; one mma takes one input type")
    wb, wb_axes = _writeback(func, main, ko)
    extra = {x.name for x in func.subtree(main.name, 0)} - {main.name, wb.name, *(c.name for c in copies)}
    if extra:
        fail(main, f"blocks {sorted(extra)} run inside it; the mma lowering knows only the copies and write-back")
    stages = dict(loops[ko].annotations).get("pipeline_stages", 1)
    raster = dict(loops[roles["by"]].annotations).get("raster", 1)
    for key, v in (("pipeline_stages", stages), ("raster", raster)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 16:
            fail(main, f"annotation {key}={v!r} is not an integer in 1..16")
    return MmaPlan(main, wb, a.source.dtype, m, n, k, batch, a, b, tile, warp, roles, stages, raster, wb_axes,
                   instruction, k_slice)


def _copy_of(func: Func, main: Block, ld: Load) -> Block:
    producers = func.producers(ld.buffer)
    if len(producers) != 1:
        fail(main, f"{ld.buffer} has {len(producers)} producers")
    copy = producers[0]
    if copy.attach is None or copy.attach.block != main.name or copy.attach.position != "before":
        fail(main, f"{copy.name} is not computed at one of its loops (compute_at the shared copy)")
    src = copy.value
    if not (isinstance(src, Load) and src.indices == tuple(Var(a.name) for a in copy.axes)):
        fail(main, f"{copy.name} is not a plain copy")
    source = func.buffer(src.buffer)  # type: ignore[union-attr]
    if source.name not in func.inputs or source.dtype not in OPERAND_DTYPES or copy.reducer is not None:
        fail(main, f"{copy.name} copies {source.name} ({source.dtype}), not a float16/bfloat16 input")
    return copy


def _affine(e: Expr, ext: dict[str, int | None], lane: str) -> tuple[dict[str, int], dict[str, int], int]:
    """Loop terms {loop: coefficient} (loops of extent 1 dropped), lane terms {'//' or '%': coefficient},
    constant.  Anything else in the expression fails the match (None)."""
    terms, c = to_affine(simplify(e))
    out: dict[str, int] = {}
    lanes: dict[str, int] = {}
    for atom, coef in terms.items():
        if isinstance(atom, Var) and atom.name in ext:
            if ext[atom.name] != 1:
                out[atom.name] = coef
        elif (isinstance(atom, Binary) and atom.op in ("//", "%") and atom.a == Var(lane)
              and atom.b == Const(4)):
            lanes[atom.op] = coef
        elif lane in free_vars(atom):  # the lane in any other role: not the mma fragment layout
            lanes[str(atom)] = coef
        else:
            out["?"] = coef
    return out, lanes, c


def _axes(main: Block, roles: dict[str, str], ext: dict[str, int | None], inner: set[str]
          ) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """Which axis is m, n and k (by how the lane enters its binding), and each one's loop terms."""
    axis_of: dict[str, str] = {}
    terms_of: dict[str, dict[str, int]] = {}
    lane = roles["lane"]
    for a, bnd in zip(main.axes, main.bindings):
        terms, lanes, c = _affine(bnd, ext, lane)
        role = "k" if a.kind == "R" else ("m" if lanes == {"//": 1} else "n" if lanes == {"%": 2} else None)
        if lanes and role not in ("m", "n"):
            fail(main, f"axis {a.name} uses the lane as {lanes}, not as an mma fragment row or column")
        if role is None:
            continue
        if role in axis_of or c != 0 or "?" in terms:
            fail(main, f"axis {a.name}'s binding {bnd} is not of the warp-tile form")
        axis_of[role], terms_of[role] = a.name, terms
    if set(axis_of) != {"m", "n", "k"}:
        fail(main, f"its bindings give the mma roles {sorted(axis_of)}, not m, n and k")
    for role, (blk, warp) in OUTER.items():
        allowed = {roles[r] for r in (blk, warp) if r} | inner
        if set(terms_of[role]) - allowed:
            fail(main, f"axis {axis_of[role]} depends on loops outside its block, warp and mma tiles")
    return axis_of, terms_of


def _tiles(main: Block, roles: dict[str, str], ext: dict[str, int | None], axis_of: dict[str, str],
           terms_of: dict[str, dict[str, int]]) -> tuple[dict[str, int], tuple[int, int]]:
    """Block tile per axis and the warp tile, read off the serial loops' extents; the warp and block loops
    must then step by exactly those tiles."""
    tile: dict[str, int] = {}
    warp: dict[str, int] = {}
    for role, (blk, wrp) in OUTER.items():
        terms = dict(terms_of[role])
        outer = {roles[r] for r in (blk, wrp) if r}
        span = 0
        for coef, want in INNER[role].items():
            loop = next((x for x, v in terms.items() if v == coef and x not in outer), None)
            if loop is None and want is not None:
                fail(main, f"the {role} binding lacks the serial loop of stride {coef} and extent {want}")
            if loop is not None and want is not None and ext[loop] != want:
                fail(main, f"loop {loop} (stride {coef} of {role}) has extent {ext[loop]}, not {want}")
            terms.pop(loop, None)
            span = coef * (1 if loop is None else ext[loop] or 0)  # the larger stride comes last
        warp[role] = span  # the warp tile along m/n, the k step along k
        for r in (wrp, blk):
            if r is None:
                continue
            loop = roles[r]
            if loop in terms and terms.pop(loop) != span:
                fail(main, f"loop {loop} does not step by the {role} tile {span}")
            if r == wrp:
                span *= ext[loop] or 0
        if terms:
            fail(main, f"the {role} binding has extra terms {terms}")
        tile[axis_of[role]] = span
    if warp["n"] % 16:  # B fragments are loaded two n8 tiles at a time (ldmatrix.x4)
        fail(main, f"the warp tile is {warp['n']} columns wide, not a multiple of 16")
    return tile, (warp["m"], warp["n"])


def _check_guards(main: Block) -> None:
    """Only ``binding(axis) < extent(axis)`` guards: the lowering's zero-fill and store guards cover them."""
    bounds = [(to_affine(simplify(b)), a.extent) for a, b in zip(main.axes, main.bindings)]
    for p in conjuncts(main.predicate):
        if not (isinstance(p, Binary) and p.op == "<" and (to_affine(simplify(p.a)), p.b) in bounds):
            fail(main, f"its guard {p} is not the bound of one of its axes")


def _k_slice(main: Block, ops: list[Load], k: str, batch: tuple[str, ...], tile: dict[str, int]) -> str | None:
    """The split-K slice axis: a batch axis read, in both operands, only beside k as ``k + KS * slice`` with
    ``KS`` the k extent, in whole k steps (a partial last step would read into the next slice).  None when
    the operands read k alone."""
    found = set()
    for ld in ops:
        for idx in ld.indices:
            used = free_vars(idx)
            found |= {a for a in batch if a in used and k in used}
    if not found:
        return None
    if len(found) > 1:
        fail(main, f"its operands read k beside the axes {sorted(found)}; one split-K slice axis at most")
    axis = found.pop()
    extent = as_int(main.axis(k).extent)
    if extent is None or extent % tile[k]:
        fail(main, f"its k slices ({main.axis(k).extent} long, split-K over axis {axis}) are not whole k steps of "
                   f"{tile[k]}")
    for ld in ops:
        for idx in ld.indices:
            terms, _ = to_affine(simplify(idx))
            if axis in free_vars(idx) and (k not in free_vars(idx) or terms.get(Var(axis)) != extent):
                fail(main, f"it reads {ld.buffer} at {idx}: split-K slice axis {axis} must step k by the slice's "
                           f"{extent}")
    return axis


def _operand(func: Func, main: Block, ld: Load, copy: Block, origin: dict[str, str], ext: dict[str, int | None],
             tile: dict[str, int], k_slice: str | None = None) -> Operand:
    shared, source = func.buffer(ld.buffer), func.buffer(copy.value.buffer)  # type: ignore[attr-defined]
    axes = {a.name for a in main.axes}
    dims: list[str] = []
    for idx in ld.indices:
        hit = sorted(free_vars(idx) & axes - {k_slice})
        if len(hit) != 1:
            fail(main, f"it reads {ld.buffer} at {idx}, not at one axis per dimension")
        dims.append(hit[0])
    if len(shared.shape) != len(source.shape) or len(dims) < 2:
        fail(main, f"{ld.buffer} does not mirror the dimensions of {source.name}")
    if shared.permute or shared.align:
        # the lowering lays the tile out itself (swizzled for ldmatrix, or the wgmma canonical layouts)
        fail(main, f"{ld.buffer} has a storage_permute/storage_align layout; the tensor-core lowering lays out "
                   "its shared tiles itself")
    _check_origins(main, ld, copy, dims, origin, ext, tile, k_slice)
    for d, (axis, size) in enumerate(zip(dims, shared.shape)):
        # compute_at clips the region to the operand, so a tile may be smaller than the block tile; the
        # lowering always stages whole block tiles, zero-filled past the operand's edge.
        want = tile.get(axis, 1) if d >= len(dims) - 2 else 1
        if (as_int(size) or want + 1) > want:
            fail(main, f"{ld.buffer} dimension {d} holds {size} elements, more than the {want} of one block tile")
    last = as_int(source.shape[-1])
    if last is None or last % COPY_ELEMENTS:
        fail(main, f"{source.name}'s rows ({source.shape[-1]} elements) are not 16-byte aligned for cp.async")
    return Operand(shared, source, tuple(dims))


def _check_origins(main: Block, ld: Load, copy: Block, dims: list[str], origin: dict[str, str],
                   ext: dict[str, int | None], tile: dict[str, int], k_slice: str | None = None) -> None:
    """The tile staged per k step starts where the lowering copies from (block row/column times the block
    tile, the k loop times block_k plus the block's slice of K, the block's own batch element), and the main
    block reads it shifted by exactly that: ``origin`` maps m, n and k to their block loop."""
    binding = {a.name: b for a, b in zip(main.axes, main.bindings)}

    def affine(e: Expr) -> tuple[dict, int]:
        # a block loop of extent 1 only ever holds 0 (a batch of one matrix): its terms are no offset at all
        terms, c = to_affine(simplify(e))
        return {v: k for v, k in terms.items() if not (isinstance(v, Var) and ext.get(v.name) == 1)}, c

    for d, (axis, read, base) in enumerate(zip(dims, ld.indices, copy.bindings)):
        base_terms = affine(base - Var(copy.loops[d].name))
        start = Var(axis)
        if axis in origin:
            loop = origin[axis]
            want: tuple[dict, int] = ({Var(loop): tile[axis]}, 0) if ext[loop] != 1 else ({}, 0)
            if k_slice and main.axis(axis).kind == "R":  # k: the block's slice, KS * (the slice's binding)
                stride = as_int(main.axis(axis).extent) or 0
                start = start + Var(k_slice) * Const(stride)
                sliced = affine(binding[k_slice] * Const(stride))
                terms = dict(want[0])
                for v, c in sliced[0].items():
                    terms[v] = terms.get(v, 0) + c
                want = ({v: c for v, c in terms.items() if c}, want[1] + sliced[1])
        else:  # a batch dimension: the block's own element
            want = affine(binding[axis])
        negated = ({v: -k for v, k in want[0].items()}, -want[1])
        if base_terms != want or affine(read - start) != negated:
            fail(main, f"{ld.buffer} dimension {d} is not the block's tile of axis {axis} (it starts at {base})")


def _writeback(func: Func, main: Block, ko: str) -> tuple[Block, dict[str, str]]:
    readers = [b for b in func.consumers(main.store) if b.name != main.name]
    if len(readers) != 1:
        fail(main, f"{main.store} is read by {len(readers)} blocks, not by one write-back")
    wb = readers[0]
    names = [lp.name for lp in main.loops]
    if (wb.attach is None or wb.attach.block != main.name or wb.attach.position != "after"
            or names.index(wb.attach.loop) >= names.index(ko) or wb.reducer is not None):
        fail(main, f"its write-back {wb.name} is not a spatial block attached after a loop outside {ko}")
    if func.buffer(wb.store).scope != "global":
        fail(main, f"its write-back stores {wb.store}, which is not a global buffer")
    reads = [ld for ld in loads(wb.value) if ld.buffer == main.store]
    main_axes, wb_names = {a.name for a in main.axes}, {a.name for a in wb.axes}
    mapping: dict[str, str] = {}
    for d, (mine, theirs) in enumerate(zip(main.store_indices, reads[0].indices)):
        ma, wa = sorted(free_vars(mine) & main_axes), sorted(free_vars(theirs) & wb_names)
        shift_m, shift_w = to_affine(simplify(mine - Var(ma[0]))) if ma else None, None
        if len(ma) == 1 and len(wa) == 1:
            shift_w = to_affine(simplify(theirs - Var(wa[0])))
        if shift_m is None or shift_m != shift_w or any(ld.indices != reads[0].indices for ld in reads):
            fail(main, f"its write-back reads {main.store} dimension {d} at {theirs}, not where it was written")
        mapping[wa[0]] = ma[0]
    others = [ld.buffer for ld in loads(wb.value) if ld.buffer != main.store]
    if any(func.buffer(x).scope != "global" for x in others):
        fail(main, f"its write-back reads {others}; only global buffers can be read in the epilogue")
    return wb, mapping
