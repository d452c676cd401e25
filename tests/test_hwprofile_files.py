"""Hardware profile files that are broken in ways a text editor or a shared directory allows."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml

import schedlib.hw as hw
from schedlib.errors import ProfileError
from schedlib.hw import ProfileWarning

REPO = Path(__file__).resolve().parents[1]
H100_TEXT = (REPO / "hwprofiles" / "h100.yaml").read_text()
H100_NAME = "NVIDIA H100 80GB HBM3"  # an alias of the shipped h100


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SCHEDLIB_HWPROFILE_PATH", str(tmp_path))
    return tmp_path


def profile_text(key: str) -> str:
    return H100_TEXT.replace("key: h100", f"key: {key}")


def profile_dict(key: str) -> dict:
    return yaml.safe_load(H100_TEXT) | {"key": key}


@pytest.mark.parametrize("content", [b"key: [\n", b"\xff\xfe\x00garbage"], ids=["bad_yaml", "not_utf8"])
def test_a_broken_file_on_the_path_does_not_break_other_lookups(user_dir: Path, content: bytes) -> None:
    (user_dir / "broken.yaml").write_bytes(content)
    with pytest.warns(ProfileWarning, match="broken.yaml"):
        assert hw.load(H100_NAME).key == "h100"
    with pytest.warns(ProfileWarning, match="broken.yaml"), pytest.raises(ProfileError) as err:
        hw.load("nonexistent")
    assert "unknown hardware profile 'nonexistent'" in str(err.value) and "'h100'" in str(err.value)
    with pytest.warns(ProfileWarning, match="broken.yaml"):
        keys = hw.list()
    assert "h100" in keys and "broken" not in keys
    with pytest.warns(ProfileWarning, match="broken.yaml"):
        assert "h100" in {p.key for p in hw.all_profiles()}
    with pytest.raises(ProfileError, match=r"broken\.yaml: line"):  # by its own key the error is raised
        hw.load("broken")


def test_listing_leaves_out_an_invalid_profile_but_loading_it_says_why(user_dir: Path) -> None:
    (user_dir / "mygpu.yaml").write_text(profile_text("mygpu").replace("sm_count: 132", "sm_count: -1"))
    with pytest.warns(ProfileWarning, match=r"mygpu.yaml: field 'sm_count' = -1"):
        assert "mygpu" not in hw.list()
    with pytest.raises(ProfileError, match=r"mygpu.yaml: field 'sm_count' = -1"):
        hw.load("mygpu")


def test_non_utf8_profile_is_a_profile_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"key: bin\nname: \xff\n")
    with pytest.raises(ProfileError, match=r"bin.yaml: line 2: not UTF-8 text \(byte 0xff at offset 15\)"):
        hw.load(path)


def test_duplicate_yaml_key_is_refused_with_key_and_lines(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(profile_text("dup") + "sm_count: 1\n")
    first = 1 + H100_TEXT.splitlines().index("sm_count: 132")
    last = len(path.read_text().splitlines())
    with pytest.raises(ProfileError, match=rf"dup.yaml: line {last}: .*duplicate key 'sm_count', first .*line {first}"):
        hw.load(path)
    flow = tmp_path / "flow.yaml"
    flow.write_text("{key: flow, key: other}\n")
    with pytest.raises(ProfileError, match=r"flow\.yaml: line 1: .*duplicate key 'key'"):
        hw.load(flow)


def test_yaml_merge_keys_are_not_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "merge.yaml"
    path.write_text("base: &b {x: 1}\nover:\n  <<: *b\n  x: 2\n")
    with pytest.raises(ProfileError, match=r"field 'base'.*unknown field"):  # parsed; fails only validation
        hw.load(path)


def test_duplicate_json_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(profile_dict("dup"))[:-1] + ', "sm_count": 1}')
    with pytest.raises(ProfileError, match=r"dup.json: invalid JSON \(duplicate key 'sm_count'"):
        hw.load(path)


def test_mixed_case_file_names_load_under_their_lowercase_key(user_dir: Path) -> None:
    # Keys are matched case-insensitively everywhere else, so the stem's case must not matter either.
    (user_dir / "MyGPU.yaml").write_text(profile_text("mygpu"))
    assert "mygpu" in hw.list()
    assert hw.load("mygpu").key == hw.load("MYGPU").key == hw.load(user_dir / "MyGPU.yaml").key == "mygpu"
    (user_dir / "Other.yaml").write_text(profile_text("mygpu"))
    with pytest.raises(ProfileError, match="field 'key' = 'mygpu': must equal the file name stem 'other'"):
        hw.load("other")


def test_uppercase_json_suffix_is_parsed_as_json(tmp_path: Path) -> None:
    path = tmp_path / "shout.JSON"
    path.write_text('{"key": }')
    with pytest.raises(ProfileError, match=r"shout\.JSON: line 1: invalid JSON"):
        hw.load(path)


@pytest.mark.parametrize("arg", [123, None, b"h100", 1.5])
def test_load_refuses_non_names_like_resolve(arg: object) -> None:
    with pytest.raises(ProfileError, match=r"load\(\): argument name_or_path="):
        hw.load(arg)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "suffix,text",
    [(".yaml", "key: " + "[" * 3000 + "]" * 3000 + "\n"), (".json", '{"key": ' + "[" * 100_000 + "]" * 100_000 + "}")],
    ids=["yaml", "json"],
)
def test_absurd_nesting_is_a_profile_error(tmp_path: Path, suffix: str, text: str) -> None:
    path = tmp_path / f"deep{suffix}"
    path.write_text(text)
    with pytest.raises(ProfileError, match=f"deep{suffix}: nested too deeply"):
        hw.load(path)


def test_bad_yaml_scalar_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "stamp.yaml"
    path.write_text("key: stamp\nname: 2001-13-45\n")
    with pytest.raises(ProfileError, match=r"stamp.yaml: line 2: invalid YAML \(bad value: month must be in"):
        hw.load(path)


@pytest.mark.parametrize(("suffix", "text", "shown"), [
    (".yaml", "key: [1,\n", r"line 2: invalid YAML \(expected the node content, but found '<stream end>'\)$"),
    (".yaml", "name: x\n  bad: [\n", r"line 2: invalid YAML \(mapping values are not allowed here\): 'bad: \['$"),
    (".json", '{"key": 1,\n', r"line 2: invalid JSON \(Expecting property name enclosed in double quotes\)$")],
    ids=["yaml-at-the-end", "yaml-line", "json-at-the-end"])
def test_a_parse_error_shows_its_line_only_where_there_is_one(tmp_path: Path, suffix: str, text: str,
                                                             shown: str) -> None:
    path = tmp_path / f"cut{suffix}"
    path.write_text(text)
    with pytest.raises(ProfileError, match=shown):  # at the end of the file, no ": ''"
        hw.load(path)


def test_anchor_expansion_is_abbreviated_in_messages(tmp_path: Path) -> None:
    levels = ["&l0 [x, x, x, x, x, x, x, x, x]"] + [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 5)]
    path = tmp_path / "bomb.yaml"
    path.write_text(profile_text("bomb").replace("aliases:", f"aliases: [{', '.join(levels)}]\nold_aliases:", 1))
    text = path.read_text()
    path.write_text(text[: text.index("old_aliases:")] + text[text.index("source:") :])
    with pytest.raises(ProfileError, match="field 'aliases'") as err:
        hw.load(path)
    assert len(str(err.value)) < 5000  # in full: 9**5 items, some 300 kB


def test_valid_profiles_still_load_without_warnings(user_dir: Path) -> None:
    (user_dir / "mygpu.yaml").write_text(profile_text("mygpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "mygpu" in hw.list() and hw.load("mygpu").sm_count == 132


def test_a_profile_written_from_scratch_hears_of_every_absent_field_at_once(tmp_path: Path) -> None:
    path = tmp_path / "mygpu.yaml"
    path.write_text("key: mygpu\nname: My GPU\nsm_count: 80\n")
    with pytest.raises(ProfileError) as info:
        hw.load(path)
    text = str(info.value)
    assert text.startswith(f"{path}: required fields are absent: source, compute_capability, ")
    assert "bandwidth_gbs" in text and "peak_tflops" in text and "sm_count" not in text.split("absent:")[1]
    assert "aliases" not in text  # optional


def test_aliases_are_optional_and_a_copied_file_says_how_to_fix_its_key(tmp_path: Path) -> None:
    data = profile_dict("mygpu")
    del data["aliases"]
    path = tmp_path / "mygpu.yaml"
    path.write_text(yaml.safe_dump(data))
    assert hw.load(path).aliases == ()
    copied = tmp_path / "copy.yaml"
    copied.write_text(H100_TEXT)
    with pytest.raises(ProfileError, match=r"must equal the file name stem 'copy' \(a profile is looked up by its "
                                           r"file's name: set key: copy, or rename the file to h100\.yaml\)"):
        hw.load(copied)


def test_a_path_entry_that_is_not_a_directory_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "no-such-dir"
    monkeypatch.setenv("SCHEDLIB_HWPROFILE_PATH", str(missing))
    with pytest.warns(ProfileWarning, match=f"names {missing}, which is not a directory; no profiles are read"):
        assert hw.load(H100_NAME).key == "h100"  # the built-in profiles are still found


def test_numbers_read_as_yaml_1_2_writes_them(user_dir: Path) -> None:
    """Regression: PyYAML's YAML 1.1 rules read `3.35e3` as a string (the exponent needs a dot and a
    sign there) and `2:12` as 132 (base 60)."""
    (user_dir / "h100.yaml").write_text(H100_TEXT.replace("dram: 3350", "dram: 3.35e3"))
    assert hw.load("h100").bandwidth_gbs.dram == 3350.0
    (user_dir / "h100.yaml").write_text(H100_TEXT.replace("sm_count: 132", "sm_count: 2:12"))
    with pytest.raises(ProfileError, match=r"sm_count.*'2:12'"):
        hw.load("h100")


def test_the_carver_follows_a_profile_directory_added_later(user_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the carver remembered a profile per name only, so a user directory set after a first
    call (shadowing the built-in h100, as for hw.load) went unseen."""
    import schedlib as sl

    f = sl.workloads.gemv(4096, 4096, "float16")
    config = sl.rules.get_rule("gemv").default_config(f, hw.load("h100"))
    monkeypatch.delenv("SCHEDLIB_HWPROFILE_PATH")
    before = sl.carver.estimate(f, "h100", config)["t_dram_us"]
    (user_dir / "h100.yaml").write_text(H100_TEXT.replace("dram: 3350", "dram: 335"))
    monkeypatch.setenv("SCHEDLIB_HWPROFILE_PATH", str(user_dir))
    assert sl.carver.estimate(f, "h100", config)["t_dram_us"] == pytest.approx(10 * before)


def test_a_copied_profile_that_kept_the_aliases_is_named_when_it_takes_a_gpu_name(user_dir: Path) -> None:
    """Regression: a user's h100r64.yaml (the shipped h100 with a lower register cap, aliases kept) silently took
    lookups of the GPU's name and ``detect()`` on a real H100; now a ProfileWarning names both files."""
    from test_hwprofile_detect import H100_PROPS

    (user_dir / "h100r64.yaml").write_text(profile_text("h100r64"))
    for find in (lambda: hw.load(H100_NAME), lambda: hw.detect(properties=H100_PROPS)):
        with pytest.warns(ProfileWarning, match=r"2 hardware profiles answer to .*h100r64\.yaml.*h100\.yaml"):
            assert find().key == "h100r64"  # the search order still decides, as documented
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hw.load("h100").key == "h100"  # by key: no ambiguity


def test_a_shipped_profiles_file_name_says_to_load_it_by_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``load("h100.yaml")`` reads ./h100.yaml; where there is none, the error says how to name the shipped one."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ProfileError, match=r"h100\.yaml: no such file in the working directory; .*load\('h100'\)"):
        hw.load("h100.yaml")
    with pytest.raises(ProfileError, match="no such hardware profile file"):
        hw.load("nonesuch.yaml")  # not a profile's name either: the plain error
    (tmp_path / "h100.yaml").write_text(profile_text("h100").replace("clock_mhz: 1980", "clock_mhz: 1700"))
    assert hw.load("h100.yaml").clock_mhz == 1700  # a file that is there is read, as before
