"""Profile paths that name something other than a small regular file: a named pipe, a device, a directory,
a huge file.  Regression: ``parse_file`` read any explicit path whole, so a FIFO hung ``--target`` forever and
a link to /dev/zero ran out of memory.

The hostile cases run in a child process under a memory and time limit, so a regression fails the test
instead of hanging it or exhausting the memory of the machine running the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import schedlib.hw as hw
from schedlib.errors import ProfileError
from schedlib.hw.profile_file import MAX_PROFILE_BYTES, parse_file

REPO = Path(__file__).resolve().parents[2]
needs_posix = pytest.mark.skipif(not hasattr(os, "mkfifo") or not Path("/dev/zero").exists(),
                                 reason="needs named pipes and /dev/zero")

# The child caps its address space (1 GiB: an import of schedlib needs far less) before loading.
_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
import schedlib.hw as hw
from schedlib.errors import ProfileError
try:
    hw.load(sys.argv[1])
except ProfileError as exc:
    print(exc)
"""


def _child(*args: str, cli: bool = False) -> subprocess.CompletedProcess[str]:
    code = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
            "sys.argv[0] = 'schedlib'; runpy.run_module('schedlib', run_name='__main__')") if cli else _CHILD
    env = {k: v for k, v in os.environ.items() if k != "SCHEDLIB_HWPROFILE_PATH"}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                          env=env, cwd=REPO)


@needs_posix
@pytest.mark.parametrize("kind", ["fifo", "zero", "urandom"])
def test_special_files_are_refused_without_reading(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.yaml"
    if kind == "fifo":
        os.mkfifo(path)  # nobody writes: opening it for reading used to block forever
    else:
        path.symlink_to(f"/dev/{kind}")  # endless: reading it whole used to fill memory
    done = _child(str(path))
    assert done.returncode == 0, done.stderr[-2000:]
    expected = "a named pipe" if kind == "fifo" else "a character device"
    assert done.stdout.strip() == f"{path}: is not a regular file ({expected}), so it cannot be a hardware profile"


@needs_posix
def test_cli_target_fifo_or_dev_zero_fails_with_one_line(tmp_path: Path) -> None:
    """The reviewer's commands: `schedlib carve reduce --target fifo.yaml` (and a link to /dev/zero)."""
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "zero.yaml").symlink_to("/dev/zero")
    for name, kind in (("fifo.yaml", "a named pipe"), ("zero.yaml", "a character device")):
        done = _child("carve", "reduce", "--target", str(tmp_path / name), cli=True)
        assert done.returncode == 2, done.stderr[-2000:]
        assert "Traceback" not in done.stderr
        assert f"{tmp_path / name}: is not a regular file ({kind})" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_a_directory_named_like_a_profile_is_refused(tmp_path: Path) -> None:
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(ProfileError, match=r"dir\.yaml: is not a regular file \(a directory\)"):
        hw.load(tmp_path / "dir.yaml")


def test_a_file_over_the_size_cap_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_PROFILE_BYTES + 1))
    with pytest.raises(ProfileError, match=rf"big\.yaml: is larger than {MAX_PROFILE_BYTES} bytes, not a hardware"):
        hw.load(big)
    # Exactly at the cap is still read (a comment-only file parses to None, which validation then rejects).
    big.write_bytes(b"#" * MAX_PROFILE_BYTES)
    assert parse_file(big) is None


def test_a_symlink_to_a_regular_profile_still_loads(tmp_path: Path) -> None:
    link = tmp_path / "a100.yaml"
    link.symlink_to(REPO / "hwprofiles" / "a100.yaml")
    assert hw.load(link) == hw.load("a100")
