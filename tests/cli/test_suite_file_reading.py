"""Suite files that cannot be read as a suite: nested past Python's recursion limit, or not UTF-8.  Each is
the library's own error naming the file (never a RecursionError or a bare codec message), and one
``schedlib: error:`` line with exit status 2 from the command."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedlib import cli
from schedlib.errors import IRError, SchedlibError
from schedlib.suites import load_suite_file, suite


def error_line(capsys: pytest.CaptureFixture) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("schedlib: error: "), lines
    return lines[0].removeprefix("schedlib: error: ")


# file name -> its text (built in the test: a parameter this long would be the test's id)
DEEP = {"deep.json": lambda: "[" * 100_000 + "]" * 100_000, "deep.yaml": lambda: "[" * 5000 + "]" * 5000,
        "deep.yml": lambda: "- " * 3000 + "matmul", "deep_map.json": lambda: '{"a":' * 100_000 + "1" + "}" * 100_000}


@pytest.mark.parametrize("name", list(DEEP))
def test_a_deeply_nested_suite_file_is_a_schedlib_error(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text(DEEP[name]())
    with pytest.raises(IRError, match=f"suite file {path}: nested too deeply"):
        load_suite_file(path)


@pytest.mark.parametrize("name", ["deep.json", "deep.yaml"])
def test_compare_on_a_deeply_nested_suite_file_is_one_line(tmp_path: Path, name: str,
                                                          capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / name
    path.write_text(DEEP[name]())
    out = tmp_path / "c"
    assert cli.main(["compare", "--suite", str(path), "--out", str(out), "--methods", "rule"]) == 2
    assert error_line(capsys).startswith(f"suite file {path}: nested too deeply")
    assert not out.exists()


def test_nesting_within_the_limit_is_still_an_entry_error(tmp_path: Path) -> None:
    path = tmp_path / "nested.json"
    path.write_text("[" * 50 + '"matmul"' + "]" * 50)
    with pytest.raises(IRError, match=f"suite file {path}: entry 0 must be a spec string"):
        load_suite_file(path)


@pytest.mark.parametrize(("name", "data", "where"), [
    ("bin.yaml", b"\xff\xfe- matmul\n", "byte 0xff on line 1, offset 0"),
    ("latin1.json", b'[\n  "matmul",\n  "caf\xe9"\n]', "byte 0xe9 on line 3, offset 20"),
])
def test_a_suite_file_that_is_not_utf8_names_the_file(tmp_path: Path, name: str, data: bytes, where: str,
                                                     capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(SchedlibError, match=f"suite file {path}: not UTF-8 text \\({where}\\)"):
        suite(str(path))
    assert cli.main(["compare", "--suite", str(path), "--out", str(tmp_path / "c"), "--methods", "rule"]) == 2
    assert error_line(capsys) == f"suite file {path}: not UTF-8 text ({where}); save it as UTF-8"


def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    for name in ("bom.json", "bom.yaml"):
        path = tmp_path / name
        path.write_bytes("\ufeff".encode() + (b'["matmul:M=64,N=64,K=64"]' if name.endswith("json")
                                              else b"- matmul:M=64,N=64,K=64\n"))
        assert [s.text for s in load_suite_file(path)] == ["matmul:M=64,N=64,K=64"]


def _aliases(levels: int) -> str:
    """YAML whose last anchor means 9**levels strings (a few hundred bytes: aliases share, a repr does not)."""
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("entry", "needle"), [
    ("{kind: matmul, M: *a4}", "entry 0: workload matmul: M=[[[...], [...], [...], [...], ...], "),
    ("{kind: matmul, dtype: *a4}", "entry 0: workload matmul: dtype=[[[...], "),
    ("{kind: *a4}", "entry 0: unknown workload [[[...], "),
    ("{kind: matmul, label: *a4}", "entry 0: label=[[[...], "),
])
def test_a_huge_aliased_value_is_shown_short(tmp_path: Path, entry: str, needle: str) -> None:
    path = tmp_path / "aliases.yaml"
    path.write_text(_aliases(5) + f"workloads:\n  - {entry}\n")
    with pytest.raises(IRError) as info:
        load_suite_file(path)
    message = str(info.value)  # before the fix: all 9**5 strings (a19, 9**20, never ended)
    assert message.startswith(f"suite file {path}: ") and needle in message, message
    assert len(message.removeprefix(f"suite file {path}: ")) < 300, message


def test_a_nested_value_within_the_limit_is_shown_short(tmp_path: Path) -> None:
    path = tmp_path / "mid.json"
    path.write_text('[{"kind": "matmul", "M": ' + "[" * 900 + "]" * 900 + "}]")
    with pytest.raises(IRError, match=r"entry 0: workload matmul: M=\[\[\[...\]\]\] must be a positive int") as info:
        load_suite_file(path)
    assert len(str(info.value)) < 300
