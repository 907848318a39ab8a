"""One declaration of the binding's C helpers, and each operator's argument order taken from its
prototype: the run helpers are generated from include/aclnnop/, the wrappers' tensor names are checked
against the prototype, and a config's attributes are laid out by the prototype's names — so a header
whose parameters are swapped is refused or followed, never silently mismatched."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
from helpers.build_time import build_abi

from aclnn_py._binding import prototypes as _abi

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "include"
DISPATCH_H = "aclnnop/aclnn_moe_distribute_dispatch_v5.h"
DISPATCH = "aclnnMoeDistributeDispatchV5"
COMBINE = "aclnnMoeDistributeCombineV5"


def build_ffi():
    """build_ffi.py, loaded from the checkout (it is not part of the installed package)."""
    spec = importlib.util.spec_from_file_location("_aclnn_py_build_ffi_for_test", ROOT / "build_ffi.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def swapped_include(tmp_path: Path, first: str, second: str) -> Path:
    """A copy of include/ whose dispatch prototype has parameters `first` and `second` swapped."""
    copy = tmp_path / "include"
    shutil.copytree(INCLUDE, copy)
    header = copy / DISPATCH_H
    text = header.read_text()
    assert first in text and second in text
    header.write_text(text.replace(first, "@@").replace(second, first).replace("@@", second))
    return copy


def layouts_of(include: Path) -> dict[str, _abi.RunLayout]:
    return _abi.run_layouts(build_abi().parse(include).functions)


def test_the_wrappers_agree_with_the_prototypes(acl):
    from aclnn_py.ops import _layout, combine, dispatch

    for module in (dispatch, combine):
        layout = module.SIGNATURE.layout  # checked on first use
        assert layout == layouts_of(INCLUDE)[module.PHASE2]
        assert _layout.order_problems(layout, module.INPUTS, module.OUTPUTS) == []
    # a run helper for every generation's two operators, and nothing else
    from aclnn_py.ops.generations import GENERATIONS

    assert set(_layout.compiled_layouts()) == {g.phase2(op) for g in GENERATIONS for op in ("dispatch", "combine")}


def test_generated_run_helper_follows_the_prototype():
    layout = layouts_of(INCLUDE)[DISPATCH]
    assert layout.helper == "aclnnpy_run_aclnnMoeDistributeDispatchV5"
    assert layout.inputs[:3] == ("context", "x", "expertIds") and layout.outputs[0] == "expandXOut"
    assert layout.strings == ("commAlg",) and len(layout.ints) == 15
    # commAlg sits between expertTokenNumsType and zeroExpertNum in the prototype
    assert layout.call[19:22] == (("a", 11), ("s", 0), ("a", 12))
    ffi_module = build_ffi()
    _, run_params = ffi_module.helper_declarations(build_abi().parse(INCLUDE))
    _, body = ffi_module.run_helper(layout, run_params)
    assert "t[7], a[0], a[1]" in body and "a[11], s[0], a[12]" in body and "a[14], t[8]" in body


def test_swapped_tensor_parameters_are_refused_by_name(tmp_path):
    from aclnn_py.ops import _layout
    from aclnn_py.ops import dispatch as d

    swapped = layouts_of(swapped_include(tmp_path, "const aclTensor *x,", "const aclTensor *expertIds,"))[DISPATCH]
    assert swapped.inputs[1:3] == ("expertIds", "x")
    problems = _layout.order_problems(swapped, d.INPUTS, d.OUTPUTS)
    assert problems == [f"{DISPATCH}GetWorkspaceSize: input 1 is expertIds in the prototype, x in aclnn-py",
                        f"{DISPATCH}GetWorkspaceSize: input 2 is x in the prototype, expert_ids in aclnn-py"]


def test_a_wrapper_in_another_order_is_refused_at_first_use(acl):
    from aclnn_py.ops import _layout
    from aclnn_py.ops import dispatch as d

    inputs = list(d.INPUTS)
    inputs[3], inputs[4] = inputs[4], inputs[3]
    with pytest.raises(_layout.LayoutMismatchError, match="input 3 is scalesOptional in the prototype, "
                       "x_active_mask in aclnn-py"):
        _ = _layout.Signature(DISPATCH, tuple(inputs), d.OUTPUTS).layout
    with pytest.raises(_layout.LayoutMismatchError, match="output 0 is expandXOut"):
        _ = _layout.Signature(DISPATCH, d.INPUTS, d.OUTPUTS[1:]).layout
    with pytest.raises(_layout.LayoutMismatchError, match="no run helper"):
        _ = _layout.Signature("aclnnNoSuchOp", d.INPUTS, d.OUTPUTS).layout


def test_swapped_attributes_are_laid_out_in_the_header_order(acl, tmp_path):
    from aclnn_py.ops import MoeConfig

    cfg = MoeConfig(ep_world_size=4, ep_rank_id=1, moe_expert_num=8, ccl_buffer_size=1 << 20, quant_mode=2)
    swapped = layouts_of(swapped_include(tmp_path, "int64_t epWorldSize,", "int64_t moeExpertNum,"))[DISPATCH]
    original = layouts_of(INCLUDE)[DISPATCH]
    assert list(cfg.packed(original).ints)[:3] == [4, 1, 8]
    assert list(cfg.packed(swapped).ints)[:3] == [8, 1, 4]
    assert list(cfg.packed(original).ints)[9] == 2  # quantMode
    assert acl.backend().ffi.string(cfg.packed(original).strings[0]) == b""


def test_an_attribute_without_a_config_field_is_named(acl):
    from aclnn_py.ops import MoeConfig

    layout = layouts_of(INCLUDE)[DISPATCH]
    odd = _abi.RunLayout(layout.phase1, "aclnnOddOp", layout.inputs, layout.outputs, layout.ints + ("warpFactor",),
                         layout.strings, layout.call)
    cfg = MoeConfig(ep_world_size=2, ep_rank_id=0, moe_expert_num=2, ccl_buffer_size=1 << 20)
    with pytest.raises(TypeError, match="MoeConfig has no field for the attribute warpFactor"):
        cfg.packed(odd)


def test_a_phase1_the_helpers_cannot_pass_is_refused():
    proto = build_abi().parse(INCLUDE).functions
    ws = next(f for f in proto if f.name == f"{DISPATCH}GetWorkspaceSize")
    odd = _abi.Prototype(ws.name, ws.decl, ws.ret, ws.ret_canon,
                         (_abi.Param("double alpha", "alpha", "double"), *ws.params))
    with pytest.raises(ValueError, match="parameter alpha .*tensors, integers, bools and strings only"):
        _abi.run_layout(odd)
    with pytest.raises(ValueError, match="ends with"):
        _abi.run_layout(_abi.Prototype(ws.name, ws.decl, ws.ret, ws.ret_canon, ws.params[:-1]))


def test_every_helper_of_the_header_is_in_the_extension(acl):
    """cffi's declarations are parsed from csrc/aclnnpy.h: each helper it declares is callable."""
    ffi_module = build_ffi()
    decls, run_params = ffi_module.helper_declarations(build_abi().parse(INCLUDE))
    names = [d.split("(")[0].split()[-1].lstrip("*") for d in decls if "(" in d and not d.startswith(("struct", "typedef"))]
    assert "aclnnpy_symbol_count" in names and "aclnnpy_prototypes" in names and len(names) >= 10
    lib = acl.backend().lib
    for name in names:
        assert callable(getattr(lib, name)), name
    assert [n for _, n in run_params][:3] == ["t", "a", "s"]
