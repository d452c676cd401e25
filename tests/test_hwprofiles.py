"""Hardware profiles: the shipped data files, their validation, lookup and packaging (detection from a device:
``test_hwprofile_detect.py``)."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

import schedlib.hw as hw
from schedlib.errors import ProfileError
from schedlib.hw import ARCH_TABLE, HardwareProfile

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ["a100", "a10g", "h100", "h100_pcie", "h200", "l4", "l40s", "rtx4090", "rtx5090", "t4", "v100"]
detect_module = importlib.import_module("schedlib.hw.detect")

@pytest.fixture(autouse=True)
def _no_user_profile_path(monkeypatch):
    monkeypatch.delenv("SCHEDLIB_HWPROFILE_PATH", raising=False)


def shipped_raw(key: str = "h100") -> dict:
    return yaml.safe_load((REPO / "hwprofiles" / f"{key}.yaml").read_text())


def write_profile(directory: Path, raw: dict, stem: str = "h100", suffix: str = ".yaml") -> Path:
    path = directory / f"{stem}{suffix}"
    path.write_text(json.dumps(raw) if suffix == ".json" else yaml.safe_dump(raw, sort_keys=False))
    return path


# ---------------------------------------------------------------- shipped profiles


def test_list_returns_the_shipped_keys_sorted():
    assert hw.list() == SHIPPED


@pytest.mark.parametrize("key", SHIPPED)
def test_every_shipped_profile_loads_validates_and_names_a_source(key):
    profile = hw.load(key)
    assert isinstance(profile, HardwareProfile)
    assert profile.key == key and profile.origin.endswith(f"{key}.yaml")
    assert profile.source and any("https://" in s for s in profile.source)
    assert profile.arch == "sm_" + profile.compute_capability.replace(".", "")
    # the file's own header comment exists (the brief: a header comment per file)
    assert (REPO / "hwprofiles" / f"{key}.yaml").read_text().startswith("# NVIDIA")
    assert profile.shared_memory_per_block_optin + profile.shared_memory_reserved_per_block <= (
        profile.shared_memory_per_sm
    )
    assert profile.peak_flops("float32", tensor_core=False) > 1e12


@pytest.mark.parametrize("key", SHIPPED)
def test_shipped_numbers_agree_with_the_architecture(key):
    """fp32 peak = SMs x FP32 lanes x 2 x clock, shared bandwidth = SMs x 128 B x clock: catches typos."""
    p = hw.load(key)
    lanes = ARCH_TABLE[p.cc].fp32_lanes_per_sm
    assert p.peak_tflops.fp32_simt * 1e12 == pytest.approx(p.sm_count * lanes * 2 * p.clock_hz, rel=0.01)
    assert p.shared_bytes_per_s == pytest.approx(p.sm_count * 128 * p.clock_hz, rel=1e-4)
    assert p.max_warps_per_sm * p.warp_size == p.max_threads_per_sm
    assert ("wgmma" in p.tensor_core_shapes) == (p.compute_capability == "9.0")


def test_h100_values_and_helpers():
    p = hw.load("h100")
    assert (p.sm_count, p.clock_mhz, p.compute_capability, p.arch) == (132, 1980, "9.0", "sm_90")
    assert p.l2_bytes == 50 * 2**20
    assert p.max_shared_per_block(opt_in=False) == 48 * 1024
    assert p.max_shared_per_block(opt_in=True) == 227 * 1024
    assert p.dram_bytes_per_s == 3350e9
    assert p.peak_flops("float16", tensor_core=True) == pytest.approx(989.4e12)
    assert p.peak_flops("bfloat16", tensor_core=True) == pytest.approx(989.4e12)
    assert p.peak_flops("float32", tensor_core=True) == pytest.approx(494.7e12)  # TF32
    assert p.peak_flops("int8", tensor_core=True) == pytest.approx(1978.9e12)
    assert p.shared_allocation(0) == 1024  # the driver reserve alone
    assert p.shared_allocation(1000) == 2048  # 1000 + 1024 rounded up to 128
    assert p.registers_per_warp(33) == 1280  # 33 x 32 = 1056 rounded up to 256
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.sm_count = 1  # type: ignore[misc]
    assert {p: "usable as a cache key"}[hw.load("h100")]  # frozen and hashable


def test_peak_flops_raises_for_absent_units():
    v100 = hw.load("v100")
    assert v100.peak_flops("float16", tensor_core=True) == pytest.approx(125e12)
    with pytest.raises(ProfileError, match=r"v100: .*bf16_tensor"):
        v100.peak_flops("bfloat16", tensor_core=True)
    with pytest.raises(ProfileError, match="int8_tensor"):
        v100.peak_flops("int8", tensor_core=True)
    with pytest.raises(ProfileError, match="models no such unit"):
        hw.load("h100").peak_flops("int8", tensor_core=False)
    with pytest.raises(ProfileError, match="float64"):
        hw.load("h100").peak_flops("float64", tensor_core=False)


def test_aliases_resolve_case_insensitively_and_are_unique():
    seen: dict[str, str] = {}
    for key in SHIPPED:
        for alias in hw.load(key).aliases:
            assert alias.lower() not in seen, f"alias {alias!r} of {key} also names {seen.get(alias.lower())}"
            seen[alias.lower()] = key
            assert hw.load(alias).key == key
            assert hw.load("  " + alias.upper().replace(" ", "   ") + " ").key == key
    assert hw.load("NVIDIA H100 80GB HBM3").key == "h100"  # what cupy/nvidia-smi report
    assert hw.load("Tesla V100-SXM2-32GB").key == "v100"
    assert hw.load("H100").key == "h100"  # keys are case-insensitive too


def test_unknown_name_lists_known_keys():
    with pytest.raises(ProfileError) as err:
        hw.load("h900")
    assert "'h900'" in str(err.value)
    for key in SHIPPED:
        assert f"'{key}'" in str(err.value)


def test_profile_round_trips_through_yaml_json_and_pathlike(tmp_path):
    original = hw.load("a100")
    json.dumps(original.to_dict())  # plain data, printable as JSON
    as_json = write_profile(tmp_path, original.to_dict(), stem="a100", suffix=".json")
    assert hw.load(str(as_json)) == original
    yml_dir = tmp_path / "yml"
    yml_dir.mkdir()
    as_yml = write_profile(yml_dir, original.to_dict(), stem="a100", suffix=".yml")
    assert hw.load(as_yml) == original  # os.PathLike accepted


def test_user_directories_come_first_and_can_shadow(tmp_path, monkeypatch):
    mine = shipped_raw("h100") | {"key": "mygpu", "name": "My GPU", "aliases": ["ACME Turbo 9000"]}
    write_profile(tmp_path, mine, stem="mygpu")
    write_profile(tmp_path, shipped_raw("h100") | {"clock_mhz": 1755})  # shadows the shipped h100
    monkeypatch.setenv("SCHEDLIB_HWPROFILE_PATH", str(tmp_path))
    assert hw.list() == sorted([*SHIPPED, "mygpu"])
    assert hw.load("mygpu").name == "My GPU"
    assert hw.load("acme turbo 9000").key == "mygpu"
    assert hw.load("h100").clock_mhz == 1755
    assert hw.profile_dirs()[0] == tmp_path


def test_changed_file_is_reloaded(tmp_path):
    path = write_profile(tmp_path, shipped_raw("h100"))
    assert hw.load(path).clock_mhz == 1980
    path.write_text(path.read_text().replace("clock_mhz: 1980", "clock_mhz: 1700"))
    assert hw.load(path).clock_mhz == 1700


# ---------------------------------------------------------------- broken files


def _drop(field):
    def mutate(raw):
        del raw[field]

    return mutate


def _set(field, value):
    def mutate(raw):
        if "." in field:
            outer, inner = field.split(".")
            raw[outer][inner] = value
        else:
            raw[field] = value

    return mutate


BROKEN = [
    ("missing field", _drop("sm_count"), ["'sm_count' = <missing>", "required field is absent"]),
    ("wrong type", _set("sm_count", "132"), ["'sm_count' = '132'", "must be an integer, got str"]),
    ("negative value", _set("sm_count", -3), ["field 'sm_count' = -3: must be a positive integer"]),
    ("boolean is no integer", _set("max_blocks_per_sm", True), ["'max_blocks_per_sm' = True"]),
    ("out of range", _set("l2_bytes", 52428800 * 4096), ["'l2_bytes' = 214748364800", "between"]),
    ("registers per thread past the ISA's 255", _set("max_registers_per_thread", 300),
     ["'max_registers_per_thread' = 300", "between 24 and 255"]),
    ("registers per thread below ptxas's 24", _set("max_registers_per_thread", 16),
     ["'max_registers_per_thread' = 16", "between 24 and 255"]),
    ("unknown field", _set("sm_cont", 132), ["'sm_cont' = 132", "unknown field", "did you mean 'sm_count'"]),
    ("per-block > per-SM", _set("shared_memory_per_block_optin", 300000),
     ["'shared_memory_per_block_optin' = 300000", "exceeds shared_memory_per_sm (233472)"]),
    ("threads per block > per SM", _set("max_threads_per_block", 4096),
     ["'max_threads_per_block' = 4096", "exceeds max_threads_per_sm (2048)"]),
    ("warps inconsistent", _set("max_warps_per_sm", 48), ["'max_warps_per_sm' = 48", "warp_size"]),
    ("negative bandwidth", _set("bandwidth_gbs.dram", -1), ["'bandwidth_gbs.dram' = -1", "positive"]),
    ("nested unknown", _set("bandwidth_gbs.hbm", 1), ["'bandwidth_gbs.hbm' = 1", "unknown field"]),
    ("missing nested", _set("bandwidth_gbs", {"dram": 3350, "l2": 9700}),
     ["'bandwidth_gbs.shared' = <missing>"]),
    ("l2 slower than dram", _set("bandwidth_gbs.l2", 100),
     ["'bandwidth_gbs.l2' = 100.0", "faster than DRAM"]),
    ("fp32 peak is required", _set("peak_tflops.fp32_simt", None), ["'peak_tflops.fp32_simt' = None"]),
    ("unquoted capability", _set("compute_capability", 9.0), ["'compute_capability' = 9.0", "quoted string"]),
    ("malformed capability", _set("compute_capability", "sm90"), ["'compute_capability' = 'sm90'"]),
    ("key differs from file", _set("key", "h200"), ["'key' = 'h200'", "file name stem 'h100'"]),
    ("source without URL", _set("source", "a datasheet"), ["'source' = 'a datasheet'", "URL"]),
    ("aliases not a list", _set("aliases", "H100"), ["'aliases' = 'H100'", "list of non-empty strings"]),
    ("bad mma shape", _set("tensor_core_shapes", ["16x8x16"]), ["'tensor_core_shapes' = '16x8x16'"]),
    ("wgmma off Hopper", lambda raw: raw.update(compute_capability="8.0"), ["'wgmma'", "sm_90"]),
    ("unknown template", _set("disabled_templates", ["wgmma_ws", "tma"]),
     ["'disabled_templates' = 'tma'", "not a template", "'mma_sync', 'wgmma', 'wgmma_tma', 'wgmma_ws'"]),
    ("templates not a list", _set("disabled_templates", "wgmma_ws"), ["list of non-empty strings"]),
]  # fmt: skip


@pytest.mark.parametrize("case, mutate, fragments", BROKEN, ids=[c[0] for c in BROKEN])
def test_broken_profile_names_file_field_and_value(tmp_path, case, mutate, fragments):
    raw = shipped_raw("h100")
    mutate(raw)
    path = write_profile(tmp_path, raw)
    with pytest.raises(ProfileError) as err:
        hw.load(path)
    message = str(err.value)
    assert str(path) in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_bad_yaml_syntax_names_file_and_line(tmp_path):
    path = tmp_path / "h100.yaml"
    text = (REPO / "hwprofiles" / "h100.yaml").read_text()
    path.write_text(text.replace("sm_count: 132", "sm_count: [132"))
    with pytest.raises(ProfileError) as err:
        hw.load(path)
    assert str(path) in str(err.value) and "invalid YAML" in str(err.value)
    assert "line " in str(err.value)


def test_bad_json_syntax_names_file_line_and_text(tmp_path):
    path = tmp_path / "h100.json"
    path.write_text('{\n  "key": "h100",\n  "sm_count": 13 2\n}\n')
    with pytest.raises(ProfileError, match=r"h100\.json: line 3: invalid JSON .*sm_count"):
        hw.load(path)


def test_yaml_tags_are_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "h100.yaml"
    path.write_text(f"key: !!python/object/apply:pathlib.Path.touch [{str(marker)!r}]\n")
    with pytest.raises(ProfileError, match="invalid YAML"):
        hw.load(path)
    assert not marker.exists()


def test_top_level_must_be_a_mapping_and_suffix_known(tmp_path):
    path = tmp_path / "h100.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ProfileError, match=r"h100\.yaml: the top level must be a mapping.*list"):
        hw.load(path)
    with pytest.raises(ProfileError, match="must end in one of"):
        hw.load(tmp_path / "h100.txt")
    with pytest.raises(ProfileError, match="no such hardware profile file"):
        hw.load(tmp_path / "absent.yaml")


# ---------------------------------------------------------------- packaging


_OFFLINE = (
    "Could not find a version that satisfies",
    "No matching distribution found",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Max retries exceeded",
)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SCHEDLIB_HWPROFILE_PATH")}


def test_wheel_ships_profiles_inside_the_package(tmp_path):
    """The wheel carries hwprofiles/ as schedlib/_hwprofiles, and an installed schedlib finds them there."""
    command = [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-w", str(tmp_path / "dist")]
    if importlib.util.find_spec("hatchling") is not None:
        command.append("--no-build-isolation")  # build offline with the installed backend
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0 and any(marker in output for marker in _OFFLINE):
        pytest.skip("cannot build the wheel offline: hatchling is not installed and no index is reachable")
    if proc.returncode != 0 and "Readme file does not exist" in output:
        pytest.skip("no wheel can be built: pyproject.toml names README.md as the readme and it is missing")
    assert proc.returncode == 0, output[-4000:]
    (wheel,) = (tmp_path / "dist").glob("schedlib-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert "schedlib/_hwprofiles/h100.yaml" in names
        assert {f"schedlib/_hwprofiles/{key}.yaml" for key in SHIPPED} <= names
        assert "schedlib/hw/profile.py" in names
        packaged = yaml.safe_load(archive.read("schedlib/_hwprofiles/h100.yaml"))
        archive.extractall(tmp_path / "site")
    assert hw.validate(packaged, "wheel:h100.yaml", stem="h100") == hw.load("h100")
    # The installed layout: profile_dirs() must pick schedlib/_hwprofiles, not the checkout's hwprofiles/.
    probe = (
        "import schedlib.hw as hw, pathlib; d = hw.profile_dirs(); "
        "assert d[-1].name == '_hwprofiles', d; print(hw.load('h100').origin)"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
        cwd=tmp_path, env={**_clean_env(), "PYTHONPATH": str(tmp_path / "site")},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "_hwprofiles" in run.stdout


# ---------------------------------------------------------------- templates a profile turns off


def test_a_profile_may_turn_templates_off(tmp_path):
    """A template that misbehaves with a card's driver can be left out: from a file, or from a loaded profile
    (the GPU suite does this with the templates that fail its self-check).  Built-in profiles turn none off
    and do not show the field."""
    h100 = hw.load("h100")
    assert h100.disabled_templates == () and "disabled_templates" not in h100.to_dict()
    raw = shipped_raw("h100")
    raw["disabled_templates"] = ["wgmma_ws"]
    loaded = hw.load(write_profile(tmp_path, raw))
    assert loaded.disabled_templates == ("wgmma_ws",) and loaded != h100
    assert loaded.to_dict()["disabled_templates"] == ["wgmma_ws"]
    both = loaded.without_templates(["mma_sync"])
    assert both.disabled_templates == ("mma_sync", "wgmma_ws") and loaded.disabled_templates == ("wgmma_ws",)
    with pytest.raises(ProfileError, match=r"h100: without_templates\(names=\['simt'\]\): unknown template\(s\) "
                                           r"\['simt'\]; the templates are \['mma_sync', "):
        h100.without_templates(["simt"])
