"""``carve(..., resources=...)``: the model's best configs priced again with the registers the compiler
allots them.  The ranking logic runs on a stand-in compiler (deterministic, no nvcc); one test compiles for
real and checks the figures against ``Kernel.compile_check``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

import schedlib as sl
from schedlib.carver.compiled import diagnostic, pool_size
from schedlib.errors import CompileError, ScheduleError
from schedlib.report.legality import no_legal_config
from schedlib.rules import get_rule
from schedlib.runtime.nvcc import find_nvcc, nvrtc_available
from schedlib.runtime.resources import compiled_resources

H100 = sl.hw.load("h100")
RAGGED = sl.workloads.matmul(1000, 1000, 4593)  # ragged tiles: ptxas allots well above the estimate


@dataclass(frozen=True)
class Usage:
    registers: int
    spill_bytes: int
    arch: str = "sm_90"


class StandInCompiler:
    """Registers and spills chosen per config (keyed by its JSON), and configs that 'fail to compile'."""

    def __init__(self, registers: dict[str, int], spills: dict[str, int] | None = None,
                 failing: tuple[str, ...] = (), default: int | None = None) -> None:
        self.registers, self.spills, self.failing, self.default = registers, spills or {}, failing, default
        self.calls = 0

    @staticmethod
    def tile(config: dict[str, Any]) -> str:
        return json.dumps(config, sort_keys=True)

    def __call__(self, schedule: sl.Schedule) -> Usage:
        self.calls += 1
        key = self.tile(schedule.config)
        if key in self.failing:
            raise CompileError(f"ptxas: error in a stand-in kernel {key}")
        model = get_rule("matmul").tiling(RAGGED, H100, schedule.config).registers
        return Usage(self.registers.get(key, model if self.default is None else self.default), self.spills.get(key, 0))


def _model_top(n: int) -> list[dict[str, Any]]:
    return list(sl.carver.carve(RAGGED, H100, topk=n)["config"])


def test_compiled_registers_reorder_the_ranking_and_spilling_configs_go_last() -> None:
    top = _model_top(pool_size(3))
    first, second, third = (StandInCompiler.tile(c) for c in top[:3])
    compiler = StandInCompiler({first: 255, second: 64}, spills={third: 48})
    df = sl.carver.carve(RAGGED, H100, topk=3, resources=compiler)
    assert compiler.calls == pool_size(3) == 8  # the model's best 8 are compiled, no more
    tiles = [StandInCompiler.tile(c) for c in df["config"]]
    assert third not in tiles  # it spills, and five of the pool do not
    row = {StandInCompiler.tile(r["config"]): r for r in df.to_dict("records")}
    assert row[second]["registers_per_thread"] == 64
    assert row[second]["model_registers"] == get_rule("matmul").tiling(RAGGED, H100, top[1]).registers
    # blocks per SM follow the compiled registers: 64 registers fit more blocks than the estimate did
    assert row[second]["blocks_per_sm"] > sl.carver.estimate(RAGGED, H100, top[1])["blocks_per_sm"]
    if first in row:  # 255 registers: fewer resident blocks than the model's estimate
        assert row[first]["blocks_per_sm"] < sl.carver.estimate(RAGGED, H100, top[0])["blocks_per_sm"]
    assert (df["spill_bytes"] == 0).all()
    assert df.attrs["compiled"] == {"arch": "sm_90", "compiled": 8, "failed": 0, "unlaunchable": 0, "spilling": 1}


def test_spilling_configs_stay_when_all_spill_and_rank_after_the_others() -> None:
    top = _model_top(pool_size(2))
    spills = {StandInCompiler.tile(c): 8 * (i + 1) for i, c in enumerate(top)}
    del spills[StandInCompiler.tile(top[5])]
    df = sl.carver.carve(RAGGED, H100, topk=2, resources=StandInCompiler({}, spills=spills))
    assert list(df["spill_bytes"]) == [0, spills[StandInCompiler.tile(df["config"][1])]]
    assert StandInCompiler.tile(df["config"][0]) == StandInCompiler.tile(top[5])


def test_a_config_that_fails_to_compile_is_left_out_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    top = _model_top(pool_size(2))
    bad = StandInCompiler.tile(top[0])
    df = sl.carver.carve(RAGGED, H100, topk=2, resources=StandInCompiler({}, failing=(bad,)))
    assert bad not in [StandInCompiler.tile(c) for c in df["config"]]
    assert df.attrs["compiled"]["failed"] == 1 and df.attrs["compiled"]["compiled"] == 8  # the ninth stood in
    assert "did not compile, left out: ptxas: error in a stand-in kernel" in caplog.text


def test_a_config_the_rule_fails_to_schedule_is_left_out_and_counted(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """The model ranked a config that the rule's schedule then refuses: it is counted as failed, not raised."""
    top = _model_top(pool_size(2))
    bad = StandInCompiler.tile(top[1])
    rule = get_rule("matmul")
    schedule = type(rule).schedule

    def refusing(self: Any, func: Any, facts: Any, config: Any, target: Any) -> sl.Schedule:
        if StandInCompiler.tile(dict(config)) == bad:
            raise ScheduleError("split", "factors", [7], "a stand-in refusal")
        return schedule(self, func, facts, config, target)

    monkeypatch.setattr(type(rule), "schedule", refusing)
    compiler = StandInCompiler({})
    df = sl.carver.carve(RAGGED, H100, topk=2, resources=compiler)
    assert bad not in [StandInCompiler.tile(c) for c in df["config"]]
    assert df.attrs["compiled"]["failed"] == 1 and df.attrs["compiled"]["compiled"] == 8
    assert compiler.calls == 8  # the refused config never reached the compiler; the ninth stood in
    assert "a stand-in refusal" in caplog.text


def test_when_no_config_compiles_the_toolchain_is_named_in_one_error() -> None:
    """Every config failing alike (an architecture the compiler dropped, a broken toolchain) is no empty
    ranking blamed on the knob space: it is a CompileError with the compiler's first error."""
    top = _model_top(pool_size(2))
    compiler = StandInCompiler({}, failing=tuple(StandInCompiler.tile(c) for c in top))
    with pytest.raises(CompileError, match="none of the 8 configs the model ranked best built and compiled; "
                                           "the first: ptxas: error in a stand-in kernel"):
        sl.carver.carve(RAGGED, H100, topk=2, resources=compiler)


def test_the_warning_quotes_the_compilers_error_not_its_command_line() -> None:
    err = CompileError("nvcc failed for sm_70 (exit 1): /usr/local/bin/nvcc -arch=sm_70 -cubin -o /tmp/x/k.cubin "
                       "/tmp/x/k.cu\nnvcc fatal   : Unsupported gpu architecture 'sm_70'")
    assert diagnostic(err) == "nvcc fatal   : Unsupported gpu architecture 'sm_70'"
    assert diagnostic(CompileError("one line only")) == "one line only"
    assert diagnostic(CompileError("")) == "CompileError"


def test_no_launchable_config_keeps_the_columns_and_best_says_why() -> None:
    df = sl.carver.carve(RAGGED, H100, topk=2, resources=StandInCompiler({}, default=300))
    assert df.empty and {"model_registers", "spill_bytes", "est_time_us"} <= set(df.columns)
    # each one that cannot launch is replaced by the next, up to twice the pool of 8
    assert df.attrs["compiled"] == {"arch": "sm_90", "compiled": 16, "failed": 0, "unlaunchable": 16, "spilling": 0}
    assert "compiled for sm_90 can launch on h100 with the registers ptxas allots" in no_legal_config(df)
    with pytest.raises(ScheduleError, match="none of the 16 configs compiled for sm_90 can launch on h100"):
        sl.carver.best(RAGGED, H100, resources=StandInCompiler({}, default=300))


def test_configs_that_fail_are_replaced_by_the_next_of_the_ranking() -> None:
    """Three of the model's best eight fail: the next three are compiled instead, so the top four are whole."""
    top = _model_top(pool_size(4) + 3)
    failing = tuple(StandInCompiler.tile(c) for c in top[1:4])
    compiler = StandInCompiler({}, failing=failing)
    df = sl.carver.carve(RAGGED, H100, topk=4, resources=compiler)
    assert len(df) == 4 and not {StandInCompiler.tile(c) for c in df["config"]} & set(failing)
    assert df.attrs["compiled"] == {"arch": "sm_90", "compiled": 8, "failed": 3, "unlaunchable": 0, "spilling": 0}
    assert compiler.calls == 11


def test_a_compile_report_without_kernels_is_a_compile_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class Built:
        def compile_check(self, arch: str) -> Any:
            return type("Report", (), {"kernels": {}})()

    monkeypatch.setattr("schedlib.runtime.resources.build", lambda schedule, profile: Built())
    monkeypatch.setattr("schedlib.runtime.resources.check_arch", lambda arch: None)
    monkeypatch.setattr("schedlib.runtime.resources.find_nvcc", lambda: "nvcc")
    with pytest.raises(CompileError, match="named no kernel"):
        compiled_resources(H100)(None)


def test_a_config_that_cannot_launch_with_its_compiled_registers_is_left_out() -> None:
    """Over 255 registers (ptxas never allots that many; a stand-in can) no block is resident."""
    top = _model_top(pool_size(2))
    df = sl.carver.carve(RAGGED, H100, topk=2, resources=StandInCompiler({StandInCompiler.tile(top[0]): 300}))
    assert df.attrs["compiled"]["unlaunchable"] == 1
    assert StandInCompiler.tile(top[0]) not in [StandInCompiler.tile(c) for c in df["config"]]


def test_best_takes_the_compiled_ranking() -> None:
    top = _model_top(pool_size(1))
    chosen = StandInCompiler.tile(top[3])
    registers = {StandInCompiler.tile(c): 255 for c in top}
    registers[chosen] = 32  # the only config that keeps many blocks resident
    sch = sl.carver.best(RAGGED, H100, resources=StandInCompiler(registers))
    assert StandInCompiler.tile(sch.config) == chosen


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="resources= compiles the configs it ranks; give a topk"):
        sl.carver.carve(RAGGED, H100, topk=None, resources=StandInCompiler({}))
    with pytest.raises(TypeError, match="resources must be a function of a Schedule"):
        sl.carver.carve(RAGGED, H100, topk=2, resources="nvcc")
    for arch in ("90", "sm_", "sm_abc"):
        with pytest.raises(CompileError, match=f"arch '{arch}' is not of the form sm_XY"):
            compiled_resources(H100, arch=arch)
    with pytest.raises(ValueError, match="resources gave registers=0, spill_bytes=0 for config"):
        sl.carver.carve(RAGGED, H100, topk=2, resources=StandInCompiler({}, default=0))
    with pytest.raises(ValueError, match="resources builds for a100 and the ranking is for h100"):
        sl.carver.carve(RAGGED, H100, topk=2, resources=compiled_resources("a100"))


@pytest.mark.skipif(find_nvcc() is None and not nvrtc_available(), reason="needs nvcc or NVRTC for ptxas")
def test_real_compiler_figures_are_those_of_the_kernel() -> None:
    f = sl.workloads.matmul(100, 100, 100)
    df = sl.carver.carve(f, H100, topk=1, resources=compiled_resources(H100))
    config = df["config"][0]
    report = sl.build(get_rule("matmul").apply(f, H100, config), H100).compile_check("sm_90")
    assert df["registers_per_thread"][0] == max(k.registers for k in report.kernels.values())
    assert df["model_registers"][0] == get_rule("matmul").tiling(f, H100, config).registers
    assert df["spill_bytes"][0] == sum(k.spill_store_bytes + k.spill_load_bytes for k in report.kernels.values())
    assert df.attrs["compiled"]["arch"] == "sm_90" and df.attrs["compiled"]["compiled"] == 8


@pytest.mark.skipif(find_nvcc() is None, reason="needs nvcc, whose list of architectures leaves out sm_70")
def test_an_architecture_is_checked_against_the_compiler_that_builds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from schedlib.runtime.nvcc import check_arch

    with pytest.raises(CompileError, match="cannot build sm_70: it builds sm_75"):
        check_arch("sm_70")
    check_arch("sm_70", "nvrtc")  # NVRTC has its own list; only the name is checked
    monkeypatch.setattr("schedlib.runtime.nvcc.find_nvcc", lambda: None)
    check_arch("sm_70")  # no nvcc: nothing to ask
