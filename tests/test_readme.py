"""The README's Python examples, run as written, so that an example which breaks fails CI.

Every ```python block of README.md is an example: a complete script, run in a fresh namespace with a scratch
directory (``tmp_path``) as the working directory.  Shell blocks are only read, never run.  The leading comment
lines of a block may say:

* ``# needs ...``: what it needs beyond ``pip install .``, any of ``a GPU`` (cupy with a device), ``g++`` (the
  CPU emulator), ``nvcc`` (nvcc or NVRTC) and ``nvdisasm``.  When one is missing the example is skipped, with
  the reason schedlib gives.
* ``# continues the example above``: it runs after the previous block in the same namespace, as one test.

A block may end with ``# prints:`` and comment lines: its standard output must be exactly those lines.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
CONTINUES = "# continues the example above"
PRINTS = "# prints:"


def _gpu_missing() -> str | None:
    from schedlib.errors import BuildError
    from schedlib.runtime.gpu import require_cupy

    try:
        require_cupy()
    except BuildError as exc:
        return f"needs a CUDA device: {exc}"
    return None


def _gxx_missing() -> str | None:
    from schedlib.runtime.emulator import find_gxx

    return None if find_gxx() else "the CPU emulator needs g++ (set $SCHEDLIB_GXX or install g++)"


def _nvcc_missing() -> str | None:
    from schedlib.runtime.nvcc import find_nvcc, nvrtc_available

    if find_nvcc() or nvrtc_available():
        return None
    return "needs a CUDA compiler: neither nvcc nor NVRTC (cupy + CUDA headers) was found"


def _nvdisasm_missing() -> str | None:
    from schedlib.runtime.sass import find_nvdisasm

    return None if find_nvdisasm() else "needs nvdisasm (pip install nvidia-cuda-nvdisasm), which was not found"


# what a "# needs" line may name, and why it is missing here (None: present)
NEEDS: dict[str, Callable[[], str | None]] = {
    "a GPU": _gpu_missing,
    "g++": _gxx_missing,
    "nvcc": _nvcc_missing,
    "nvdisasm": _nvdisasm_missing,
}

# calls that need one of NEEDS: an example making them must say so in its "# needs" line
USES = {
    ".run_cpu(": "g++",
    ".bank_conflicts(": "g++",
    ".loop_mix(": "nvdisasm",
    ".compile_check(": "nvcc",
    "import cupy": "a GPU",
}
IMPLIED = {"nvdisasm": "nvcc"}  # loop_mix compiles before it disassembles


@dataclass
class Block:
    line: int  # of the opening fence, 1-based
    heading: str  # the section it is in
    code: str
    needs: set[str] = field(default_factory=set)
    continues: bool = False
    prints: list[str] | None = None  # the expected standard output, when the block shows it


@dataclass
class Example:
    blocks: list[Block]

    @property
    def id(self) -> str:
        first = self.blocks[0]
        slug = re.sub(r"[^a-z0-9]+", "-", first.heading.lower()).strip("-") or "top"
        return f"{slug}-L{first.line}"

    @property
    def needs(self) -> set[str]:
        return set().union(*(b.needs for b in self.blocks))


def parse_block(code: str, line: int, heading: str) -> Block:
    block = Block(line, heading, code)
    lines = code.splitlines()
    for text in lines:
        if not text.startswith("#"):
            break  # only the leading comments carry markers
        if text.startswith("# needs"):
            named = {need for need in NEEDS if need in text}
            if not named:
                raise ValueError(f"README.md line {line}: {text!r} names none of {sorted(NEEDS)}")
            block.needs |= named
        elif text.strip() == CONTINUES:
            block.continues = True
    if PRINTS in lines:
        tail = lines[lines.index(PRINTS) + 1:]
        if not tail or not all(t.startswith("#") for t in tail):
            raise ValueError(f"README.md line {line}: {PRINTS!r} must be followed by comment lines only")
        block.prints = [t[2:] if t.startswith("# ") else t[1:] for t in tail]
    return block


def parse_examples(text: str) -> list[Example]:
    """The python blocks of a Markdown text, grouped into examples (a block and the blocks continuing it)."""
    examples: list[Example] = []
    heading, end = "", 0
    for match in FENCE.finditer(text):
        headings = re.findall(r"^#+ +(.+)$", text[end:match.start()], re.MULTILINE)  # prose, not code
        heading, end = (headings[-1] if headings else heading), match.end()
        if match.group(1) != "python":
            continue
        block = parse_block(match.group(2), text.count("\n", 0, match.start()) + 1, heading)
        if block.continues:
            if not examples:
                raise ValueError(f"README.md line {block.line}: continues an example, but none comes before it")
            examples[-1].blocks.append(block)
        else:
            examples.append(Example([block]))
    return examples


EXAMPLES = parse_examples(README.read_text(encoding="utf-8")) if README.is_file() else []


def test_readme_has_examples() -> None:
    if not README.is_file():
        pytest.skip(f"{README} is not here (an installed copy of the tests)")
    assert len(EXAMPLES) >= 5, f"found only {len(EXAMPLES)} python examples in {README}"


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_example_declares_what_it_needs(example: Example) -> None:
    code = "\n".join(b.code for b in example.blocks)
    wanted = {need for call, need in USES.items() if call in code}
    wanted |= {IMPLIED[n] for n in wanted if n in IMPLIED}
    missing = wanted - example.needs
    assert not missing, (f"README.md line {example.blocks[0].line}: the example needs {sorted(missing)}; "
                         f"say so in a first line '# needs ...'")


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_example_runs(example: Example, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str]) -> None:
    for need in sorted(example.needs):
        reason = NEEDS[need]()
        if reason is not None:
            pytest.skip(reason)
    monkeypatch.chdir(tmp_path)  # an example that writes files writes them here
    namespace: dict[str, object] = {"__name__": "__main__"}
    for block in example.blocks:
        capsys.readouterr()
        exec(compile(block.code, f"README.md:{block.line}", "exec"), namespace)
        if block.prints is not None:
            out = [line.rstrip() for line in capsys.readouterr().out.rstrip("\n").splitlines()]
            assert out == block.prints, f"README.md line {block.line}: the example prints something else"


def test_parser_reads_markers() -> None:
    text = "\n".join([
        "## One", "```python", "# needs nvcc (or NVRTC) and nvdisasm; no GPU", "x = 1", "```",
        "```bash", "echo never run", "```",
        "## Two", "```python", "# continues the example above", "print(x)", "# prints:", "# 1", "```",
        "```python", "print('a')", "```",
    ])
    first, second = parse_examples(text)
    assert [b.line for b in first.blocks] == [2, 10]
    assert first.needs == {"nvcc", "nvdisasm"}
    assert first.blocks[1].continues and first.blocks[1].prints == ["1"]
    assert second.id == "two-L16" and not second.needs and second.blocks[0].prints is None
    with pytest.raises(ValueError, match="names none of"):
        parse_examples("```python\n# needs a TPU\n```\n")
    with pytest.raises(ValueError, match="none comes before it"):
        parse_examples("```python\n# continues the example above\n```\n")
