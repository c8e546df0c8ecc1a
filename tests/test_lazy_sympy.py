"""sympy stays unimported through a meta trace and its rehearsed step, with the graphs it would
give with sympy, and PyTorch's module table and attributes are left as found
(``neurarch_trace.lazy_sympy``).

Each check runs in a fresh interpreter: whether a module is imported is a property of a process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

#: Every fixture and example of the tracer's tests (LSTMs, attention, TorchScript, complex weights,
#: BatchNorm, LayerNorm, GELU, a tied LM), built on meta as ``--device auto`` builds it and traced
#: there with the step rehearsed; one JSON document of all graphs, then which fixture's trace
#: first imported sympy.
SWEEP = textwrap.dedent("""
    import json, sys, warnings
    sys.path.insert(0, sys.argv[2])
    if sys.argv[1] == "sympy-first":
        import sympy, torch.fx.experimental.symbolic_shapes
    import torch
    from test_closed_form import FIXTURES
    from test_devices import to_meta
    from neurarch_trace import trace_model
    from neurarch_trace.lazy_dynamo import dynamo_left_unimported
    from neurarch_trace.lazy_sympy import sympy_left_unimported

    warnings.simplefilter("ignore")
    graphs, first = {}, None
    for name in sorted(FIXTURES):
        make_model, make_inputs = FIXTURES[name]
        torch.manual_seed(0)
        inputs = to_meta(make_inputs())
        with dynamo_left_unimported(), sympy_left_unimported(), torch.device("meta"):
            model = make_model()
        graphs[name] = trace_model(model, inputs)
        if first is None and "sympy" in sys.modules:
            first = name
    print(json.dumps(graphs, sort_keys=True))
    print(first)
""")


def sweep(mode: str) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-c", SWEEP, mode, str(TESTS)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    graphs, first = proc.stdout.splitlines()
    return json.loads(graphs), first


@pytest.mark.slow
def test_meta_traces_import_no_sympy_and_give_the_graphs_made_with_it():
    fresh, first = sweep("fresh")
    assert first == "None"
    with_sympy, _ = sweep("sympy-first")
    assert len(fresh) == 28
    # the step ran on all but the three whose output no trainable parameter reaches, as on the CPU
    assert [n for n in fresh if "error" in fresh[n]["measured"]["training"]] == \
        ["ComplexLinear", "IntegerPath", "PartlyNoGrad"]
    for name in fresh:
        assert fresh[name] == with_sympy[name], name


#: The stand-in's answers on plain values, beside the real module's on the same values.
PLAIN = textwrap.dedent("""
    import sys
    import torch
    import torch._prims_common as pc
    import torch._meta_registrations as mr
    import torch.fx.experimental as experimental
    from neurarch_trace.lazy_sympy import MODULE, sympy_left_unimported

    before = (pc.elementwise_dtypes, mr.elementwise_dtypes, torch.sym_not, pc._is_non_overlapping_and_dense_or_false)
    t = torch.empty(2, 3, device="meta", dtype=torch.float16)

    def answers(ss):
        return [ss.expect_true(True), ss.guard_or_false(False), ss.guard_or_true(True),
                ss.statically_known_true(False), ss.is_nested_int(3), ss.is_nested_int(2.5),
                ss.has_guarding_hint(3), ss.guarding_hint_or_throw(4), ss.guarding_hint_or_throw(True),
                ss.guard_int(5), ss.optimization_hint(6), ss.sym_eq((1, 2), (1, 2)), ss.sym_eq((1, 2), [1, 3]),
                ss.sym_eq([1], [1, 2]), ss.sym_eq(2, 2), ss.sym_and(True, False), ss.sym_and(True, True, True),
                ss.sym_or(False, True), ss.sym_or(False, False), ss.sym_and(3), list(ss.free_unbacked_symbols(t)),
                list(ss.free_unbacked_symbols(None)),
                pc.elementwise_dtypes(t, 2.0, type_promotion_kind=pc.ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT),
                pc.elementwise_dtypes(t, type_promotion_kind=pc.ELEMENTWISE_TYPE_PROMOTION_KIND.INT_TO_FLOAT),
                torch.sym_not(True), pc.is_non_overlapping_and_dense_or_false(t.t()),
                pc.is_non_overlapping_and_dense_or_false(t[:, ::2]), pc.is_contiguous(t.t())]

    with sympy_left_unimported():
        with sympy_left_unimported():  # nested: the outer block's stand-in stays
            import torch.fx.experimental.symbolic_shapes as ss
            assert ss is sys.modules[MODULE] is experimental.symbolic_shapes
            assert ss._neurarch_stand_in
        assert sys.modules[MODULE] is ss
        stand_in = answers(ss)
        # a meta kernel of the sort the stand-ins serve: convolution, batch norm, dtype conversion
        x = torch.empty(2, 3, 8, 8, device="meta")
        y = torch.nn.functional.conv2d(x, torch.empty(4, 3, 3, 3, device="meta")).to(torch.bfloat16)
        assert y.shape == (2, 4, 6, 6) and y.dtype == torch.bfloat16
        print("sympy in the block:", "sympy" in sys.modules)
    print("left:", MODULE in sys.modules, hasattr(experimental, "symbolic_shapes"),
          before == (pc.elementwise_dtypes, mr.elementwise_dtypes, torch.sym_not,
                     pc._is_non_overlapping_and_dense_or_false))
    import torch.fx.experimental.symbolic_shapes as real
    assert not getattr(real, "_neurarch_stand_in", False)
    print("same answers:", repr(stand_in) == repr(answers(real)), repr(stand_in))
    with sympy_left_unimported():  # sympy is imported now: nothing is put in place
        assert sys.modules[MODULE] is real and pc.elementwise_dtypes is before[0]
""")

#: A symbolic value reaches the stand-in: the real module takes its place, answers, and stays.
SYMBOLIC = textwrap.dedent("""
    import sys
    import torch
    import torch.fx.experimental as experimental
    from neurarch_trace.lazy_sympy import MODULE, sympy_left_unimported

    with sympy_left_unimported():
        import torch.fx.experimental.symbolic_shapes as ss
        guard_or_false, sym_eq = ss.guard_or_false, ss.sym_eq
        ShapeEnv = ss.ShapeEnv  # a name the stand-in has not: the real module is imported
        real = sys.modules[MODULE]
        assert real is not ss and not getattr(real, "_neurarch_stand_in", False)
        assert experimental.symbolic_shapes is real
        env = ShapeEnv()
        u = env.create_unbacked_symint()
        print(guard_or_false(u >= 0), guard_or_false(u == 3), real.guard_or_false(u == 3))
        print(type(sym_eq((u, 2), (u, 2))).__name__)
    print("kept:", sys.modules[MODULE] is real, experimental.symbolic_shapes is real)
""")


def run(script: str) -> str:
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_the_stand_ins_answer_plain_values_as_pytorch_and_leave_everything_as_found():
    out = run(PLAIN).splitlines()
    assert out[0] == "sympy in the block: False"
    assert out[1] == "left: False False True"
    assert out[2].startswith("same answers: True ["), out[2]


@pytest.mark.slow
def test_a_symbolic_value_brings_in_the_real_module_which_stays():
    assert run(SYMBOLIC) == "False False False\nSymBool\nkept: True True\n"


#: A model file that takes symbolic-shapes functions at import time, and a helper module its
#: ``__init__`` imports (so inside the build), then ``torch.compile`` with dynamic shapes over a
#: function that asks ``statically_known_true`` about a symbolic size: real PyTorch says False.
TAKEN = textwrap.dedent("""
    import sys, pathlib
    root = pathlib.Path(sys.argv[1])
    top = ("import torch.fx.experimental.symbolic_shapes as ss\\n"
           "from torch.fx.experimental.symbolic_shapes import statically_known_true\\n") if sys.argv[2] == "top" else ""
    (root / "taker.py").write_text(
        "import torch\\n"
        "from torch import nn\\n" + top +
        "class Net(nn.Module):\\n"
        "    def __init__(self):\\n"
        "        super().__init__()\\n"
        "        import lazy_helper\\n"
        "        self.fc = nn.Linear(16, 4)\\n"
        "    def forward(self, x):\\n"
        "        return self.fc(x)\\n")
    (root / "lazy_helper.py").write_text(
        "from torch.fx.experimental.symbolic_shapes import guard_or_false, statically_known_true\\n"
        "class Rule:\\n"
        "    check = staticmethod(statically_known_true)\\n")
    sys.path.insert(0, str(root))
    import torch
    from neurarch_trace import api
    from neurarch_trace.inputs import parse_input
    graph, _ = api.trace_target(str(root / "taker.py") + ":Net", [parse_input("2,16")])
    import taker, lazy_helper
    real = sys.modules["torch.fx.experimental.symbolic_shapes"]
    if sys.argv[2] == "top":
        print("model file:", taker.ss is real, taker.statically_known_true is real.statically_known_true)
    print("real:", not getattr(real, "_neurarch_stand_in", False),
          lazy_helper.statically_known_true is real.statically_known_true,
          lazy_helper.guard_or_false is real.guard_or_false,
          lazy_helper.Rule.__dict__["check"].__func__ is real.statically_known_true)

    def f(x):
        return x + 100 if lazy_helper.statically_known_true(x.shape[0] == 6) else x
    compiled = torch.compile(f, backend="eager", dynamic=True)
    print("compiled:", compiled(torch.zeros(6)).tolist()[0], compiled(torch.zeros(3)).tolist()[0])
""")


@pytest.mark.slow
@pytest.mark.parametrize("where", ["top", "lazy"])
def test_what_a_model_takes_from_the_stand_in_at_import_is_the_real_module_after(tmp_path, where):
    # a notebook session kept the stand-in's statically_known_true in a model file, and a later
    # torch.compile(dynamic=True) took a branch real PyTorch never takes (a new-user pass). The
    # model file is now imported before any stand-in is placed ("top"); a module its __init__
    # imports during the build is given the real functions when the trace ends ("lazy")
    proc = subprocess.run([sys.executable, "-c", TAKEN, str(tmp_path), where], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == (["model file: True True"] if where == "top" else []) + [
        "real: True True True True", "compiled: 0.0 0.0"]
