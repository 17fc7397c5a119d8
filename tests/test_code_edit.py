"""The mechanism that runs upstream's code (``code_edit``): prove, edit, compile, install, restore.

The records' own tests prove each edit against upstream's change on SGLang's releases; these prove
the mechanism's promises on a small module file of the shape SGLang's backend has (a class whose
``__init__`` calls ``super()``, a method with a nested function and a lambda), imported from a real
file as the import system imports it, and on SGLang 0.5.12's installed backend where it matters
(the proof of the running code, in a fresh interpreter).
"""

import ast
import functools
import importlib.util
import inspect
import linecache
import subprocess
import sys
import textwrap
import threading
import traceback

import pytest

import fp8_cases
from sglang_hotfix_trtllm import code_edit

TOY = textwrap.dedent(
    """\
    from __future__ import annotations

    import math


    class Base:
        def __init__(self, size):
            self.size = size


    class Backend(Base):
        def __init__(self, size):
            super().__init__(size)
            self.scale = 1.0

        def forward(self, x, *, factor=2):
            scale = self.scale
            helper = lambda y: y * scale
            def nested(z):
                return z + 1
            y = x * factor
            return nested(helper(y))

        def other(self, x):
            return math.floor(x)
    """
)


def times_three(method, tree):
    """The toy's "upstream change": ``y = x * factor`` becomes ``y = x * factor * 3``."""
    code_edit.replace_statement(method, "y = x * factor", "y = x * factor * 3")


def plus_ten(method, tree):
    """A second record's change of the same method: ``return nested(helper(y))`` gains ``+ 10``."""
    code_edit.replace_statement(method, "return nested(helper(y))", "return nested(helper(y)) + 10")


def scale_from_helper(method, tree):
    """A change that calls a method the release lacks (``_upstream_scale``, a new name)."""
    code_edit.replace_statement(method, "scale = self.scale", "scale = self._upstream_scale()")


UPSTREAM_HELPER = "def _upstream_scale(self):\n    return self.scale * 5\n"


@pytest.fixture
def toy(tmp_path, monkeypatch):
    path = tmp_path / "toy_backend.py"
    path.write_text(TOY, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("toy_backend", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "toy_backend", module)
    yield module, str(path)
    code_edit.remove_all()


def put(module, path, record="toy", edits=None, new_names=()):
    edits = edits if edits is not None else (code_edit.Edit("forward", times_three),)
    return code_edit.put_in_force(record, module, "Backend", path, edits, new_names)


def test_the_running_code_is_proven_to_be_the_files_and_the_edit_runs_in_sglangs_own_function(toy):
    module, path = toy
    function = module.Backend.__dict__["forward"]
    original = function.__code__
    backend = module.Backend(1)
    assert backend.forward(2) == 5
    assert put(module, path) == "edited"
    assert module.Backend.__dict__["forward"] is function and function.__code__ is not original
    assert backend.forward(2) == 13  # 2 * 2 * 3 + 1
    assert original.co_filename == path
    assert function.__code__.co_filename == path + " (sglang-hotfix-trtllm: with upstream's change of record toy)"
    assert function.__code__.co_firstlineno == original.co_firstlineno
    assert put(module, path) == "already"
    assert code_edit.remove_all() == 1
    assert function.__code__ is original and backend.forward(2) == 5


def test_unchanged_lines_keep_their_numbers_and_the_edited_one_its_own(toy):
    module, path = toy
    function = module.Backend.__dict__["forward"]
    lines = sorted({line for _, _, line in function.__code__.co_lines() if line})
    put(module, path)
    assert sorted({line for _, _, line in function.__code__.co_lines() if line}) == lines


def test_everything_that_reached_the_function_before_reaches_the_new_code(toy):
    """A subclass, a bound method taken before, another patcher's functools.wraps wrapper above, and
    the class attribute itself: one function object, so all run upstream's code."""
    module, path = toy

    class Sub(module.Backend):
        pass

    backend = module.Backend(1)
    bound = backend.forward
    wrapped = functools.wraps(module.Backend.forward)(lambda *a, **k: module.Backend.__dict__["forward"](*a, **k))
    put(module, path)
    assert bound(2) == Sub(1).forward(2) == wrapped(backend, 2) == 13


def test_a_method_calling_super_keeps_its_class_cell(toy):
    module, path = toy

    def set_scale_twice(method, tree):
        code_edit.replace_statement(method, "self.scale = 1.0", "self.scale = 2.0")

    init = module.Backend.__dict__["__init__"]
    assert init.__code__.co_freevars == ("__class__",)
    put(module, path, edits=(code_edit.Edit("__init__", set_scale_twice),))
    assert init.__code__.co_freevars == ("__class__",)
    backend = module.Backend(7)
    assert (backend.size, backend.scale) == (7, 2.0)


def test_several_records_on_one_method_compile_into_one_code_object_and_off_means_left_out(toy):
    module, path = toy
    function = module.Backend.__dict__["forward"]
    put(module, path, "first")
    put(module, path, "second", (code_edit.Edit("forward", plus_ten),))
    assert module.Backend(1).forward(2) == 23
    assert code_edit.in_force("first", module.Backend, ["forward"])
    assert code_edit.in_force("second", module.Backend, ["forward"])
    code_edit.remove_all()
    put(module, path, "second", (code_edit.Edit("forward", plus_ten),))
    assert module.Backend(1).forward(2) == 15 and not code_edit.in_force("first", module.Backend, ["forward"])
    code_edit.remove_all()
    assert function.__code__.co_name == "forward" and module.Backend(1).forward(2) == 5


def test_a_new_name_is_added_before_the_code_that_calls_it_and_taken_away_after(toy):
    module, path = toy
    edits = (code_edit.Edit("forward", scale_from_helper),)
    new = (code_edit.NewName("_upstream_scale", UPSTREAM_HELPER, "toy 2.0"),)
    put(module, path, edits=edits, new_names=new)
    helper = module.Backend.__dict__["_upstream_scale"]
    assert helper.__globals__ is vars(module) and helper.__qualname__ == "Backend._upstream_scale"
    assert module.Backend(1).forward(2) == 21  # (2 * 2) * 5 + 1
    code_edit.remove_all()
    assert "_upstream_scale" not in module.Backend.__dict__ and module.Backend(1).forward(2) == 5


def test_a_traceback_through_a_new_name_shows_upstreams_text(toy):
    module, path = toy
    new = (code_edit.NewName("_upstream_scale", "def _upstream_scale(self):\n    return 1 / 0\n", "toy 2.0"),)
    put(module, path, edits=(code_edit.Edit("forward", scale_from_helper),), new_names=new)
    with pytest.raises(ZeroDivisionError) as raised:
        module.Backend(1).forward(2)
    text = "".join(traceback.format_exception(raised.value))
    assert "sglang-hotfix-trtllm: Backend._upstream_scale as in toy 2.0 (record toy)" in text
    assert "return 1 / 0" in text
    filename = raised.value.__traceback__.tb_next.tb_next.tb_frame.f_code.co_filename
    assert linecache.getline(filename, 2).strip() == "return 1 / 0"


def divide_first(method, tree):
    """Upstream's two statements, one of them over two lines, before ``y = x * factor``."""
    body = next(b for b in code_edit.statement_lists(method) if any(ast.unparse(s) == "y = x * factor" for s in b))
    index = next(i for i, s in enumerate(body) if ast.unparse(s) == "y = x * factor")
    line = body[index].lineno
    body[index:index] = [
        code_edit.statement_at("checked = x", line),
        code_edit.statement_at("x = x / (\n    factor - 2)", line),
    ]


def test_a_traceback_through_an_edited_statement_shows_the_code_that_runs(toy):
    """Issue 47, item 6: a traceback through an edited line showed the release's text at that line
    (upstream's statements are numbered from the statement they replace or precede). The edited code
    names a file of its own, whose lines are the file's with upstream's statements at theirs."""
    module, path = toy
    put(module, path, edits=(code_edit.Edit("forward", divide_first),))
    with pytest.raises(ZeroDivisionError) as raised:
        module.Backend(1).forward(2)  # factor 2: upstream's x / (factor - 2)
    frame = raised.value.__traceback__.tb_next
    filename, line = frame.tb_frame.f_code.co_filename, frame.tb_lineno
    assert filename == path + " (sglang-hotfix-trtllm: with upstream's change of record toy)"
    shown = linecache.getline(filename, line)
    assert shown.strip() == "checked = x; x = x / (factor - 2); y = x * factor", shown
    assert TOY.splitlines()[line - 1].strip() == "y = x * factor"  # what 0.14.0 showed
    assert "x = x / (factor - 2)" in "".join(traceback.format_exception(raised.value))
    source = inspect.getsource(module.Backend.forward)
    assert "checked = x; x = x / (factor - 2); y = x * factor" in source and "return nested(helper(y))" in source
    assert [text for text in source.splitlines() if "def nested" in text]  # the rest is the file's


def test_an_error_inside_upstreams_code_propagates_as_upstreams_would():
    """A repair never turns an error into output: what upstream's statement raises (here the
    out-of-memory error of a ``.contiguous()``) reaches SGLang's caller, unchanged."""

    class OutOfMemory(RuntimeError):
        pass

    class Query:
        def contiguous(self):
            raise OutOfMemory("CUDA out of memory")

    namespace = {}
    source = "class Backend:\n    def forward(self, q):\n        q = q.reshape()\n        return q\n"
    path = "<toy>"
    exec(compile(source, path, "exec", dont_inherit=True), namespace)
    tree = ast.parse(source)
    code = code_edit.compile_module(
        ast.fix_missing_locations(_with(tree, "q = q.reshape()", "q = q.contiguous()")), path
    )
    namespace["Backend"].forward.__code__ = code_edit.method_code(code, "Backend", "forward", 2)
    with pytest.raises(OutOfMemory, match="CUDA out of memory"):
        namespace["Backend"]().forward(Query())


def _with(tree, release_text, upstream_text):
    method = tree.body[0].body[0]
    code_edit.replace_statement(method, release_text, upstream_text)
    return tree


def test_no_frame_of_the_hotfix_runs_on_a_call(toy):
    module, path = toy
    put(module, path)
    seen = []

    def profile(frame, event, arg):
        if event == "call":
            seen.append(frame.f_code.co_filename)

    backend = module.Backend(1)
    sys.setprofile(profile)
    try:
        backend.forward(2)
    finally:
        sys.setprofile(None)
    # SGLang's file, as the edited code names it (the file's path first), and nothing of the hotfix's
    assert seen and set(seen) == {path + " (sglang-hotfix-trtllm: with upstream's change of record toy)"}


def test_a_call_in_flight_keeps_the_code_it_started_with(toy):
    """One pointer store: a call already running finishes with the old code, the next runs the new."""
    module, path = toy
    started, go = threading.Event(), threading.Event()
    results = []

    def slow_factor():
        started.set()
        go.wait(5)
        return 2

    backend = module.Backend(1)
    thread = threading.Thread(target=lambda: results.append(backend.forward(2, factor=_Blocking(slow_factor))))
    thread.start()
    started.wait(5)
    put(module, path)
    go.set()
    thread.join(5)
    assert results == [5] and backend.forward(2) == 13


class _Blocking(int):
    """An int whose use in ``x * factor`` first waits (the call is then in flight)."""

    def __new__(cls, wait):
        self = super().__new__(cls, 2)
        self.wait = wait
        return self

    def __rmul__(self, other):
        return other * self.wait()


def test_the_proof_names_the_field_that_differs_for_a_changed_file(toy):
    module, path = toy
    function = module.Backend.__dict__["forward"]
    data = open(path, "rb").read()
    assert code_edit.proof_problem(function, "Backend.forward", path, data, "Backend", "forward") is None
    changed = data.replace(b"y = x * factor", b"y = x * factor + 0")
    problem = code_edit.proof_problem(function, "Backend.forward", path, changed, "Backend", "forward")
    assert "co_code" in problem or "co_consts" in problem
    moved = b"\n" + data
    problem = code_edit.proof_problem(function, "Backend.forward", path, moved, "Backend", "forward")
    assert "co_firstlineno" in problem
    nested = data.replace(b"return z + 1", b"return z + 2")
    problem = code_edit.proof_problem(function, "Backend.forward", path, nested, "Backend", "forward")
    assert problem and "co_consts[" in problem  # the nested function's own constant


def test_a_file_changed_since_import_stands_the_record_aside_and_changes_nothing(toy):
    module, path = toy
    function = module.Backend.__dict__["forward"]
    original = function.__code__
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("\n")  # a later line: forward's code is still the file's
    assert put(module, path) == "edited"
    code_edit.remove_all()
    text = open(path, encoding="utf-8").read()
    open(path, "w", encoding="utf-8").write(text.replace("return nested(helper(y))", "return nested(helper(y)) - 1"))
    with pytest.raises(code_edit.NotEditable, match="not the code a fresh compile"):
        put(module, path)
    assert function.__code__ is original


@pytest.mark.parametrize("how", ["functools.wraps", "replaced"])
def test_a_method_wrapped_or_replaced_by_someone_else_is_refused(toy, how):
    module, path = toy
    original = module.Backend.__dict__["forward"]
    if how == "functools.wraps":
        module.Backend.forward = functools.wraps(original)(lambda *a, **k: original(*a, **k))
    else:
        module.Backend.forward = lambda self, x, *, factor=2: 0
    with pytest.raises(code_edit.NotEditable):
        put(module, path)
    assert original.__code__.co_name == "forward"


def test_an_edit_that_does_not_fit_names_the_record_and_changes_nothing(toy):
    module, path = toy
    function = module.Backend.__dict__["forward"]
    original = function.__code__

    def misfit(method, tree):
        code_edit.replace_statement(method, "y = x * other", "y = 0")

    with pytest.raises(code_edit.NotEditable, match="record toy's edit of forward does not fit"):
        put(module, path, edits=(code_edit.Edit("forward", misfit),))
    assert function.__code__ is original


def test_an_edit_that_would_change_the_free_variables_or_the_parameters_is_refused(toy):
    module, path = toy

    def calls_super(method, tree):
        code_edit.replace_statement(method, "return math.floor(x)", "return super().other(x)")

    def new_parameter(method, tree):
        method.args.args.append(ast.arg(arg="extra"))

    with pytest.raises(code_edit.NotEditable, match="free variables"):
        put(module, path, edits=(code_edit.Edit("other", calls_super),))
    with pytest.raises(code_edit.NotEditable, match="parameters"):
        put(module, path, edits=(code_edit.Edit("other", new_parameter),))


def test_a_new_name_the_class_has_with_another_value_is_refused(toy):
    module, path = toy
    module.Backend._upstream_scale = lambda self: 0
    new = (code_edit.NewName("_upstream_scale", UPSTREAM_HELPER, "toy 2.0"),)
    with pytest.raises(code_edit.NotEditable, match="already has _upstream_scale"):
        put(module, path, edits=(code_edit.Edit("forward", scale_from_helper),), new_names=new)


def test_remove_leaves_code_someone_changed_afterwards_and_says_so(toy, caplog):
    module, path = toy
    function = module.Backend.__dict__["forward"]
    put(module, path)
    theirs = function.__code__.replace()
    function.__code__ = theirs
    assert not code_edit.in_force("toy", module.Backend, ["forward"])
    with caplog.at_level("WARNING"):
        assert code_edit.remove_all() == 0
    assert function.__code__ is theirs and "not restoring Backend.forward" in caplog.text


def test_torch_compile_after_the_change_traces_upstreams_code_and_a_later_change_resets_dynamo(toy, caplog):
    """TorchDynamo does not see a code change made after it inlined a method (pytorch#197860): the
    hotfix edits at import, before anything compiles; a change after something compiled resets
    TorchDynamo and says so."""
    torch = pytest.importorskip("torch")
    module, path = toy
    put(module, path)
    backend = module.Backend(1)
    compiled = torch.compile(lambda x: backend.forward(x), backend="eager")
    assert compiled(torch.tensor(2.0)).item() == 13
    with caplog.at_level("WARNING"):
        code_edit.remove_all()
    assert "TorchDynamo was reset" in caplog.text
    assert compiled(torch.tensor(2.0)).item() == 5


INSTALLED_PROOF = """
import sys
import sglang.srt.layers.attention.trtllm_mha_backend as m
from sglang_hotfix_trtllm import code_edit
data = open(m.__file__, "rb").read()
for name in ("forward_decode", "forward_extend", "__init__", "_fused_fp8_set_kv_buffer"):
    function = m.TRTLLMHAAttnBackend.__dict__[name]
    print(name, code_edit.proof_problem(function, name, m.__file__, data, "TRTLLMHAAttnBackend", name))
"""


def _with_the_hook_off(script):
    """``script`` run in a fresh interpreter of this environment with the hotfix disabled at start
    (its methods are SGLang's own until the script applies it); the finished process."""
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(__import__("os").environ, SGLANG_HOTFIX_TRTLLM_DISABLE="1"),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def test_sglangs_installed_methods_are_proven_to_be_their_files_code():
    """SGLang 0.5.12 imported as a server imports it (hook off, so its methods are SGLang's own):
    each method a record edits is proven the installed file's code."""
    result = _with_the_hook_off(INSTALLED_PROOF)
    lines = [line for line in result.stdout.splitlines() if line.split(" ")[0] in INSTALLED_PROOF]
    assert lines == [
        "forward_decode None",
        "forward_extend None",
        "__init__ None",
        "_fused_fp8_set_kv_buffer None",
    ], result.stdout


IN_A_REAL_PROCESS = """
import json, os
import sglang.srt.layers.attention.trtllm_mha_backend as m
cls = m.TRTLLMHAAttnBackend
before = dict(vars(m))
functions = {n: f for n, f in vars(cls).items() if n in ("forward_decode", "forward_extend")}
codes = {n: f.__code__ for n, f in functions.items()}
os.environ.pop("SGLANG_HOTFIX_TRTLLM_DISABLE")
import sglang_hotfix_trtllm
sglang_hotfix_trtllm.apply()
replaced = sorted(n for n, v in before.items() if vars(m).get(n) is not v)
added = sorted(set(vars(m)) - set(before))
same_functions = all(vars(cls)[n] is f for n, f in functions.items())
edited = sorted(n for n, f in functions.items() if f.__code__ is not codes[n])
sglang_hotfix_trtllm.remove()
print("RESULT:" + json.dumps(dict(
    replaced=replaced, added=added, same_functions=same_functions, edited=edited,
    restored=all(f.__code__ is codes[n] for n, f in functions.items()),
    added_after_remove=sorted(set(vars(m)) - set(before)),
)))
"""


def test_in_a_real_process_no_module_global_is_replaced_and_remove_restores_the_identical_code():
    """SGLang 0.5.12 imported with the hook off, then apply(): no global of the backend module is
    replaced (upstream's new names are added: pr28144's warning helper, 0.5.22's AttentionType
    import), forward_decode and forward_extend stay SGLang's function objects running the hotfix's
    compile, and remove() puts back the identical code objects and takes the added names away."""
    result = _with_the_hook_off(IN_A_REAL_PROCESS)
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RESULT:")]
    r = __import__("json").loads(line[len("RESULT:") :])
    assert r["replaced"] == [] and r["same_functions"] and r["restored"]
    assert r["edited"] == ["forward_decode", "forward_extend"]
    assert r["added"] == ["AttentionType", "_sglang_hotfix_trtllm_warning_once"]
    assert r["added_after_remove"] == []


def test_status_verbose_shows_each_edit_as_a_diff_of_sglangs_method():
    """``status --verbose`` shows, for each record that would edit a method here, what the method
    runs against SGLang's own (on 0.5.12: pr28144's scales, pr31667's packed query)."""
    import os
    import pathlib

    cli = pathlib.Path(sys.executable).with_name("sglang-hotfix-trtllm")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_HOTFIX_TRTLLM")}
    shown = subprocess.run([str(cli), "status", "--verbose"], capture_output=True, text=True, timeout=120, env=env)
    assert shown.returncode == 0, shown.stderr[-2000:]
    blocks = shown.stdout.split("the code it runs, against SGLang's:")
    assert len(blocks) == 4  # pr28144, pr31667, encoder_only_mask on 0.5.12
    assert "+    bmm1_scale, bmm2_scale = self._get_bmm_scales(layer, q_scale)" in blocks[1]
    assert "-    q = q.reshape(-1, layer.tp_q_head_num, layer.head_dim)" in blocks[2]
    assert "+    if self.is_xqa_impl:" in blocks[2]
    assert "causal=layer.attn_type != AttentionType.ENCODER_ONLY" in blocks[3]


RELOADED_AND_MOCKED = """
import importlib, json, sys
from unittest import mock
import sglang.srt.layers.attention.trtllm_mha_backend as m
import sglang_hotfix_trtllm
from sglang_hotfix_trtllm import patch, process_state
from sglang_hotfix_trtllm.records import catalog
records = [h for h in catalog.HOTFIXES if h.edits]
def told(cls):  # what the process says, record by record
    return sorted(h.name for h in records if patch.is_patched(h, cls))
def runs(cls):  # what runs: the methods whose code is not the file's
    return sorted(n for n in ("forward_decode", "forward_extend", "_fused_fp8_set_kv_buffer", "__init__")
        if cls.__dict__[n].__code__.co_code != codes[n])
import sglang_hotfix_trtllm.code_edit as ce
fresh = ce.fresh_module_code(open(m.__file__, "rb").read(), m.__file__)
codes = {}
for c in fresh.co_consts:
    if getattr(c, "co_name", None) == "TRTLLMHAAttnBackend":
        for f in c.co_consts:
            if hasattr(f, "co_code"):
                codes[f.co_name] = f.co_code
Old = m.TRTLLMHAAttnBackend
before = told(Old), runs(Old)
importlib.reload(m)
New = m.TRTLLMHAAttnBackend
after = dict(old=[told(Old), runs(Old)], new=[told(New), runs(New)], state=sorted(
    n for n, r in process_state._records.items() if r["patched"]))
sglang_hotfix_trtllm.remove()
with mock.patch.object(New, "forward_decode", autospec=True, side_effect=New.forward_decode) as fake:
    sglang_hotfix_trtllm.apply()
    mocked = told(New)
print("RESULT:" + json.dumps(dict(before=before, after=after, mocked=mocked)))
"""


def test_a_reloaded_backend_and_a_mocked_method_are_told_as_they_run():
    """Issue 49, item 2: after ``importlib.reload`` of the backend (0.13.1: the old class's
    instances ran unrepaired while the state said patched), the old class and the new one each run
    upstream's code and the process says so; an ``apply()`` under ``mock.patch.object(...,
    autospec=True)`` says of each record what reaches the kernel (0.13.1 said pr28144 ran unpatched
    while its repair reached the kernel)."""
    result = subprocess.run([sys.executable, "-c", RELOADED_AND_MOCKED], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("RESULT:")]
    r = __import__("json").loads(line[len("RESULT:") :])
    edit_records = ["encoder_only_mask", "pr28144", "pr31667"]  # 0.5.12's edit records
    edited = ["forward_decode", "forward_extend"]
    assert r["before"] == [edit_records, edited]
    assert r["after"]["old"] == [edit_records, edited] and r["after"]["new"] == [edit_records, edited]
    assert set(edit_records) <= set(r["after"]["state"])
    assert "pr28144" not in r["mocked"] and "pr31667" not in r["mocked"]  # forward_decode is the mock's


SYNTAX_TREES_LEFT = """
import ast, gc, json
from sglang_hotfix_trtllm import detect, source

parses, walks = [], []
parse, walk_index = ast.parse, detect._walk_index
def counted_parse(source, filename="<unknown>", *args, **kwargs):
    parses.append(str(filename).endswith("trtllm_mha_backend.py"))
    return parse(source, filename, *args, **kwargs)
def counted_walk(tree):
    walks.append(type(tree).__name__)
    return walk_index(tree)
ast.parse, detect._walk_index = counted_parse, counted_walk
import sglang.srt.layers.attention.trtllm_mha_backend
ast.parse, detect._walk_index = parse, walk_index

gc.collect()
trees = sum(isinstance(o, ast.AST) for o in gc.get_objects())
print("RESULT:" + json.dumps({
    "trees": trees, "kept": source._remembered is not None, "file_parses": sum(parses), "walks": walks}))
"""


def test_a_patched_process_parses_sglangs_file_once_and_keeps_no_syntax_tree_of_it():
    # The records of one module share one parse of the backend's file; once they are in force it
    # is let go (6,591 objects the garbage collector would scan in every SGLang process).
    from conftest import clean_env, run_python

    results, logs = {}, {}
    for disabled in ("0", "1"):
        ran = run_python(["-c", SYNTAX_TREES_LEFT], env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE=disabled))
        assert ran.returncode == 0, ran.stderr[-2000:]
        (line,) = [line for line in ran.stdout.splitlines() if line.startswith("RESULT:")]
        results[disabled], logs[disabled] = __import__("json").loads(line[len("RESULT:") :]), ran.stderr
    assert "patched sglang.srt.layers.attention.trtllm_mha_backend.TRTLLMHAAttnBackend.forward_decode" in logs["0"]
    assert results["0"]["kept"] is False
    assert results["0"]["trees"] == results["1"]["trees"], results
    # Classification and the edits share that one parse and one walk of it (detect.shared_tree):
    # the edits parsed the file again and walked it four times more (0.16.2).
    assert results["0"]["file_parses"] == 1 and results["0"]["walks"] == ["Module"], results["0"]


ALL_STATEMENT_KINDS = textwrap.dedent(
    """\
    def method(self, x):
        for a in x:
            if a:
                continue
            else:
                pass
        else:
            y = [lambda z: z for _ in x]
        while x:
            try:
                x = x[1:]
            except ValueError as error:
                with open(x) as f, open(y) as g:
                    del error
            else:
                break
            finally:
                x = 0
            try:
                pass
            except* TypeError:
                x = 1
        match x:
            case [1, *rest] if rest:
                def inner():
                    class Local:
                        z = 1
                    return Local
            case _:
                async def later():
                    async with x:
                        async for b in x:
                            await b
        return y
    """
)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="except* is Python 3.11's")
def test_statement_lists_meets_every_list_in_ast_walks_order(installed_backend_source):
    trees = [ast.parse(ALL_STATEMENT_KINDS), ast.parse(installed_backend_source), ast.parse(TOY)]
    functions = [n for tree in trees for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert len(functions) > 25
    for function in functions:
        got = [id(body) for body in code_edit.statement_lists(function)]
        # the reference: fp8_cases' oracle walker, every node of ast.walk, as statement_lists read
        # them before it skipped expressions (the order records' edits meet statements in)
        assert got == [id(body) for body in fp8_cases._bodies(function)], function.name
    (method,) = trees[0].body
    assert len(list(code_edit.statement_lists(method))) == 22  # 20, a handler's body twice (its try's and its own)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="except* is Python 3.11's")
def test_the_records_walks_meet_every_node_in_ast_walks_order(installed_backend_source):
    # detect.walk (the records' looks over a method) and detect.nodes (one walk of the module,
    # shared) stand for ast.walk: a record that takes the first match must meet the same first.
    from sglang_hotfix_trtllm import detect

    for tree in (ast.parse(ALL_STATEMENT_KINDS), ast.parse(installed_backend_source), ast.parse(TOY)):
        assert [id(n) for n in detect.nodes(tree)] == [id(n) for n in ast.walk(tree)]
        for node in ast.walk(tree):
            if isinstance(node, (ast.stmt, ast.expr)):
                assert [id(n) for n in detect.walk(node)] == [id(n) for n in ast.walk(node)], ast.dump(node)[:200]
