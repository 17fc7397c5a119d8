"""The fault matrix, continued: the "Trust" promises. Each test names the
promise it defends; each class of promise has several cases.

1. `status` predicts exactly what a new process does (verdict, would_patch, exit).
2. The verdict describes the code Python actually runs.
3. The import hook is re-entrant-safe; odd `sys.modules` states never raise.
4. Start-up never harms the host; log lines appear exactly once.
5. `run` is transparent.
6. The wrapper is invisible to callers.
7. The CLI's streams and exit statuses hold under stress.
"""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

import variants
from conftest import (
    CLI,
    PATCHED,
    Ran,
    TARGET_RELATIVE,
    clean_env,
    applied_record_names,
    record_names,
    run_python,
    run_scenario,
    shadow,
    sglang_tree,
    status_json,
    wrapped_methods,
)
from sglang_hotfix_trtllm.records import pr26521
from sglang_hotfix_trtllm.record import Verdict


@pytest.fixture
def sglang_copy(tmp_path, installed_backend_path):
    """An SGLang install (a tree of links to the installed one) whose backend
    module is replaced: by other source text, or by a sourceless .pyc."""

    def make(text=None, sourceless=False):
        if text is None:
            text = installed_backend_path.read_text(encoding="utf-8")
        package = installed_backend_path.parents[3]
        return sglang_tree(tmp_path / "sglang_copy", text, link_installed=package, sourceless=sourceless)

    return make


def shadow_wrapt(tmp_path, stub):
    return shadow(tmp_path, "wrapt", stub)


# --- 1. status predicts what a new process does --------------------------------


def _predicted_vs_actual(tmp_path, env):
    shown = status_json(env=env, cwd=tmp_path)
    report, code, _ = shown.flat(), shown.returncode, shown.stderr
    ran = run_scenario("fault", "describe_or_error", env=env, cwd=tmp_path)
    assert ran.result is not None, ran
    lines = ran.hotfix_lines()
    if any("INFO: patched" in line for line in lines):
        runtime_verdict = "affected"
    elif any("upstream already has the fix" in line for line in lines):
        runtime_verdict = "fixed"
    elif any("code not recognised" in line for line in lines):
        runtime_verdict = "unknown"
    else:
        runtime_verdict = None  # refused with the verdict affected, or stood aside without a word
    return report, code, ran.result["attribute_type"] == PATCHED, runtime_verdict, lines


CASES = {
    # name: (environment maker, expected verdict, expected exit status)
    "nothing_wrong": (lambda t, c, o: {}, "affected", 0),
    "wrapt_missing": (
        lambda t, c, o: {"PYTHONPATH": shadow_wrapt(t, "raise ImportError('simulated: no wrapt')")},
        "affected",
        2,
    ),
    "wrapt_failing": (
        lambda t, c, o: {"PYTHONPATH": shadow_wrapt(t, "raise RuntimeError('simulated: wrapt broken')")},
        "affected",
        2,
    ),
    "sourceless_backend": (lambda t, c, o: {"PYTHONPATH": str(c(sourceless=True))}, "unknown", 2),
    "disabled": (lambda t, c, o: {"SGLANG_HOTFIX_TRTLLM_DISABLE": "1"}, "affected", 1),
    "excluded_by_sglang_plugins": (lambda t, c, o: {"SGLANG_PLUGINS": "someone_else"}, "affected", 1),
    "write_through_an_alias": (
        lambda t, c, o: {"PYTHONPATH": str(c(variants.with_extra_write(o, variants.OTHER_WRITES["alias_of_view"])))},
        "unknown",
        2,
    ),
    "method_defined_twice_buggy_last": (
        lambda t, c, o: {"PYTHONPATH": str(c(variants.with_method_defined_twice(o, "buggy")))},
        "affected",
        0,
    ),
    # pr26521 reads the live (fixed) class; the records that edit methods edit the live class's (an
    # earlier class naming flashinfer was refused until 0.16.0, as a route around 0.13's gate): exit 0.
    "class_defined_twice_fixed_last": (
        lambda t, c, o: {"PYTHONPATH": str(c(variants.with_class_defined_twice(o, "fixed")))},
        "fixed",
        0,
    ),
    "method_rebound_after_definition": (
        lambda t, c, o: {"PYTHONPATH": str(c(variants.REBINDINGS["method_rebound_in_class"](o)))},
        "unknown",
        2,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_status_predicts_what_a_new_process_does(case, tmp_path, sglang_copy, installed_backend_source):
    """Promise 1: would_patch, the verdict and the exit status are what the import hook then does."""
    make_env, verdict, exit_status = CASES[case]
    env = clean_env(**make_env(tmp_path, sglang_copy, installed_backend_source))
    report, code, patched, runtime_verdict, lines = _predicted_vs_actual(tmp_path, env)
    assert report["would_patch"] is patched, (report, lines)
    assert report["verdict"] == verdict and code == exit_status, report
    if runtime_verdict is not None:
        assert runtime_verdict == report["verdict"], lines
    if not patched and verdict == "affected" and exit_status == 2:
        # Refused at run time: the line says why, and status said the same.
        assert any("could not patch" in line for line in lines) and "wrapt" in report["would_patch_reason"]


def test_status_calls_a_zipped_sglang_unknown(tmp_path, installed_backend_source):
    """Promise 1: an SGLang served from a zip cannot be read, so the hook refuses: unknown, exit 2."""
    archive = tmp_path / "sglang.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        for package in ("sglang", "sglang/srt", "sglang/srt/layers", "sglang/srt/layers/attention"):
            zipped.writestr(package + "/__init__.py", "")
        zipped.writestr("sglang/" + str(TARGET_RELATIVE), installed_backend_source)
    shown = status_json(env=clean_env(PYTHONPATH=str(archive)), cwd=tmp_path)
    report, code, _ = shown.flat(), shown.returncode, shown.stderr
    assert report["verdict"] == "unknown" and code == 2 and report["would_patch"] is False
    assert "not a file on disk" in report["reason"]


def test_status_on_a_sourceless_module_names_the_pyc(tmp_path, sglang_copy, installed_backend_source):
    """Promise 1: the reason names what was found instead of a source."""
    root = sglang_copy(sourceless=True)
    shown = status_json(env=clean_env(PYTHONPATH=str(root)), cwd=tmp_path)
    report, code, stderr = shown.flat(), shown.returncode, shown.stderr
    assert code == 2 and "not loaded from a .py source" in report["reason"] and ".pyc" in report["reason"]
    assert len(stderr.strip().splitlines()) == len(report["hotfixes"])  # one line per record


# --- 2. the verdict describes the code Python runs -----------------------------


def classify(text):
    return pr26521.classify(ast.parse(text))


@pytest.mark.parametrize("live, verdict", [("buggy", Verdict.AFFECTED), ("fixed", Verdict.FIXED)])
def test_a_method_defined_twice_is_judged_by_the_last_definition(installed_backend_source, live, verdict):
    """Promise 2: Python binds the last `def`; so does the verdict."""
    assert classify(variants.with_method_defined_twice(installed_backend_source, live)).verdict is verdict


@pytest.mark.parametrize("live, verdict", [("buggy", Verdict.AFFECTED), ("fixed", Verdict.FIXED)])
def test_a_class_defined_twice_is_judged_by_the_last_definition(installed_backend_source, live, verdict):
    """Promise 2: Python binds the last `class`; so does the verdict."""
    assert classify(variants.with_class_defined_twice(installed_backend_source, live)).verdict is verdict


@pytest.mark.parametrize("rebinding", list(variants.REBINDINGS))
def test_a_method_or_class_rebound_elsewhere_is_unknown(installed_backend_source, rebinding):
    """Promise 2: when the live binding cannot be read off the source, nothing is patched."""
    result = classify(variants.REBINDINGS[rebinding](installed_backend_source))
    assert result.verdict is Verdict.UNKNOWN, result.reason


@pytest.mark.parametrize("route", list(variants.OTHER_WRITES))
def test_any_other_write_to_the_buffer_is_unknown(installed_backend_source, route):
    """Promise 2: `affected` means nothing else writes the buffer, by any route;
    `fixed` means exactly upstream's statement, right after the binding."""
    result = classify(variants.with_extra_write(installed_backend_source, variants.OTHER_WRITES[route]))
    assert result.verdict is Verdict.UNKNOWN, result.reason


def test_upstream_statement_before_the_binding_is_unknown(installed_backend_source):
    """Promise 2: upstream's statement anywhere but right after the binding is not `fixed`."""
    text = variants.with_extra_write(installed_backend_source, pr26521.UPSTREAM_STATEMENT, offset=0)
    assert classify(text).verdict is Verdict.UNKNOWN


def test_a_helper_on_the_path_that_writes_the_buffer_is_unknown(installed_backend_source):
    """Promise 2: helpers the draft-decode path calls are part of the path."""
    tree = ast.parse(installed_backend_source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TRTLLMHAAttnBackend")
    helper = next(n for n in cls.body if getattr(n, "name", None) == "_bind_swa_page_table")
    helper.body.append(ast.parse("source['cache_seqlens'].fill_(1)").body[0])
    assert classify(ast.unparse(ast.fix_missing_locations(tree))).verdict is Verdict.UNKNOWN


def test_a_buggy_live_method_after_a_fixed_one_is_patched_and_logged_as_such(
    tmp_path, sglang_copy, installed_backend_source
):
    """Promise 2 at run time: the class holds the second `def`, and that is what is wrapped."""
    root = sglang_copy(variants.with_method_defined_twice(installed_backend_source, "buggy"))
    ran = run_scenario("fault", "describe_or_error", env=clean_env(PYTHONPATH=str(root)), cwd=tmp_path)
    assert ran.result["attribute_type"] == PATCHED, ran
    assert not any("can be removed" in line for line in ran.hotfix_lines())


# --- 3. the import hook is re-entrant-safe -------------------------------------


@pytest.mark.parametrize(
    "scenario",
    [
        "autoload_reloaded",
        "modules_purged_then_entry_point",
        "twin_finders_armed",
        "finder_that_asks_find_spec",
        "odd_finder_on_meta_path",
    ],
)
def test_the_import_hook_never_recurses(scenario, tmp_path):
    """Promise 3: a reloaded or twin finder, or a finder that asks importlib again, ends in one wrapper."""
    ran = run_scenario("fault", scenario, cwd=tmp_path)
    assert ran.returncode == 0, ran
    assert "error" not in ran.result, ran.result
    assert (
        ran.result["attribute_type"] == PATCHED and ran.result["records"] == 1 and not ran.result["wrapped_is_wrapper"]
    )
    assert sum("INFO: patched" in line for line in ran.hotfix_lines()) == 1


@pytest.mark.parametrize("state", ["blocked", "object", "dict", "fake_module"])
def test_odd_sys_modules_states_never_raise(state, tmp_path):
    """Promise 3: apply(), remove() and the hook with None or a non-module in sys.modules."""
    ran = run_scenario("fault", "odd_sys_modules", state, cwd=tmp_path)
    assert ran.returncode == 0, ran
    r = ran.result
    assert "raised" not in r, r
    assert r["apply"] is True and r["remove"] == 0 and r["still_odd"]
    assert r["import"] == ("ModuleNotFoundError" if state == "blocked" else "ok")


# --- 4. start-up never harms the host ------------------------------------------


@pytest.fixture(scope="module")
def stale_pth_python(tmp_path_factory, venv_site_packages):
    """A venv holding our startup file but not the package: an uninstall that left the .pth behind."""
    folder = tmp_path_factory.mktemp("stale") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    shutil.copy(os.path.join(venv_site_packages, "sglang_hotfix_trtllm.pth"), site)
    return str(python)


def _start(python, stderr_mode, tmp_path, env=None, code="print('alive')"):
    """Start `python -c CODE` with stderr open, closed, or a broken pipe."""
    env = env or clean_env()
    if stderr_mode == "closed":
        completed = subprocess.run(
            ["bash", "-c", 'exec 2>&-; exec "$0" -c "$1"', python, code],
            capture_output=False,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=60,
        )
        return completed.returncode, completed.stdout, None
    if stderr_mode == "broken_pipe_buffered":  # Python's default buffering of a piped stderr
        env = {k: v for k, v in env.items() if k != "PYTHONUNBUFFERED"}
        stderr_mode = "broken_pipe"
    if stderr_mode == "broken_pipe":
        read, write = os.pipe()
        os.close(read)
        try:
            completed = subprocess.run(
                [python, "-c", code], stdout=subprocess.PIPE, stderr=write, text=True, env=env, cwd=tmp_path, timeout=60
            )
        finally:
            os.close(write)
        return completed.returncode, completed.stdout, None
    completed = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    return completed.returncode, completed.stdout, completed.stderr


WATCHED_IMPORT = "import sglang.srt.layers.attention.trtllm_mha_backend as b; print(b.VALUE)"


def _watched_stand_in(tmp_path):
    """A folder holding a module at the watched name: in a venv without SGLang,
    something for the .pth finder to be asked about (its content is irrelevant)."""
    folder = tmp_path / "watched"
    package = folder / "sglang" / "srt" / "layers" / "attention"
    package.mkdir(parents=True)
    for level in (folder / "sglang", folder / "sglang" / "srt", folder / "sglang" / "srt" / "layers", package):
        (level / "__init__.py").write_text("")
    (package / "trtllm_mha_backend.py").write_text("VALUE = 'imported'\n")
    return str(folder)


@pytest.mark.parametrize("stderr_mode", ["open", "closed", "broken_pipe", "broken_pipe_buffered"])
def test_a_stale_startup_file_never_stops_python_or_writes_to_stdout(stale_pth_python, tmp_path, stderr_mode):
    """Promise 4: package removed, .pth left behind: Python starts silently, and
    the watched import goes on with at most one line on stderr; stdout holds only
    the program's output."""
    code, stdout, stderr = _start(stale_pth_python, stderr_mode, tmp_path)
    assert code == 0 and stdout == "alive\n"
    assert stderr in (None, "")
    env = clean_env(PYTHONPATH=_watched_stand_in(tmp_path))
    code, stdout, stderr = _start(stale_pth_python, stderr_mode, tmp_path, env=env, code=WATCHED_IMPORT)
    assert code == 0 and stdout == "imported\n"
    if stderr is not None:
        assert len(stderr.strip().splitlines()) == 1 and "startup module failed" in stderr, stderr


@pytest.mark.parametrize("stderr_mode", ["closed", "broken_pipe"])
@pytest.mark.parametrize("damage", ["raises", "syntax_error"])
def test_a_corrupt_startup_module_never_stops_python(tmp_path, stderr_mode, damage):
    """Promise 4: the startup module itself broken, stderr unusable: Python
    starts, the watched import goes on, stdout clean."""
    body = "raise ImportError('simulated broken install')" if damage == "raises" else "def (:"
    folder = shadow(tmp_path, "sglang_hotfix_trtllm_autoload.py", body)
    code, stdout, _ = _start(sys.executable, stderr_mode, tmp_path, env=clean_env(PYTHONPATH=folder))
    assert code == 0 and stdout == "alive\n"
    env = clean_env(PYTHONPATH=folder + os.pathsep + _watched_stand_in(tmp_path))
    code, stdout, _ = _start(sys.executable, stderr_mode, tmp_path, env=env, code=WATCHED_IMPORT)
    assert code == 0 and stdout == "imported\n"


def test_a_broken_package_with_stderr_none_does_not_fail_sglangs_import(tmp_path):
    """Promise 4: the engine cannot load and sys.stderr is None: SGLang's import still succeeds."""
    folder = shadow(tmp_path, "sglang_hotfix_trtllm", "raise RuntimeError('simulated partial install')")
    ran = run_scenario("fault", "import_with_stderr_none", env=clean_env(PYTHONPATH=folder), cwd=tmp_path)
    assert ran.returncode == 0 and "error" not in ran.result, ran
    assert ran.result["attribute_type"] == "function"


def test_the_hotfix_with_stderr_none_patches_silently(tmp_path):
    """Promise 4: nothing to write to is not a reason to fail or to skip the patch."""
    ran = run_scenario("fault", "import_with_stderr_none", cwd=tmp_path)
    assert ran.returncode == 0 and ran.result["attribute_type"] == PATCHED, ran


@pytest.mark.parametrize("when", ["before", "after"])
def test_log_lines_appear_exactly_once_whenever_the_host_configures_logging(tmp_path, when):
    """Promise 4: no line lost, none doubled, whether logging is configured before or after our first line."""
    ran = run_scenario("fault", "logging_configured", when, cwd=tmp_path)
    assert ran.returncode == 0, ran
    # Our fallback prints "sglang-hotfix-trtllm INFO: patched ..."; the host's format shows the
    # message itself, which names the package (issue 37 item 6: `grep sglang-hotfix-trtllm` finds both).
    ours = re.compile(r"INFO: (sglang-hotfix-trtllm: )?(patched|removed)")
    patched = [line for line in ran.stderr.splitlines() if ours.search(line) and "patched" in line]
    removed = [line for line in ran.stderr.splitlines() if ours.search(line) and "removed:" in line]
    assert len(patched) == len(applied_record_names()) and len(removed) == 1, ran  # one line per applied record
    assert removed[0].startswith("HOST ")  # after the host's set-up, the host's handler shows our lines
    assert all(line.startswith("HOST ") == (when == "before") for line in patched)
    assert all("sglang-hotfix-trtllm" in line for line in patched + removed)
    host = [line for line in patched + removed if line.startswith("HOST ")]
    assert host and all("INFO: sglang-hotfix-trtllm: " in line for line in host)


# --- 5. run is transparent -------------------------------------------------------

PROBE = "import json, os, sys; print('RESULT:' + json.dumps({'path': sys.path, 'env': dict(os.environ)}))"


def _probe(tmp_path, env, *launcher):
    completed = subprocess.run(
        list(launcher) + [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    return Ran(completed)


def _bootstrap_entries(paths):
    return [p for p in paths if p.endswith(os.path.join("sglang_hotfix_trtllm", "bootstrap"))]


@pytest.mark.parametrize(
    "pythonpath", ["", "{a}", "{a}::{b}", ":{a}"], ids=["unset", "one", "with-empty-entry", "leading-empty"]
)
def test_run_adds_only_its_bootstrap_entry_to_sys_path(tmp_path, pythonpath):
    """Promise 5: the command's sys.path is the one it has without `run`, plus the bootstrap first."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    value = pythonpath.format(a=tmp_path / "a", b=tmp_path / "b")
    env = clean_env(**({"PYTHONPATH": value} if value else {}))
    plain = _probe(tmp_path, env)
    under_run = _probe(tmp_path, env, CLI, "run", "--")
    assert plain.returncode == under_run.returncode == 0, under_run
    bootstrap = _bootstrap_entries(under_run.result["path"])
    assert len(bootstrap) == 1
    assert [p for p in under_run.result["path"] if p not in bootstrap] == plain.result["path"]
    assert under_run.result["path"].index(bootstrap[0]) == 1  # right after the script's folder, as PYTHONPATH's first


def test_run_changes_no_other_environment_variable(tmp_path):
    """Promise 5: only PYTHONPATH differs, and only by the bootstrap entry."""
    env = clean_env(PYTHONPATH=str(tmp_path), SOMETHING="kept")
    plain, under_run = _probe(tmp_path, env), _probe(tmp_path, env, CLI, "run", "--")
    a, b = plain.result["env"], under_run.result["env"]
    assert {k for k in set(a) | set(b) if a.get(k) != b.get(k)} == {"PYTHONPATH"}
    assert b["PYTHONPATH"].split(os.pathsep)[1:] == a["PYTHONPATH"].split(os.pathsep)


@pytest.fixture
def image_sitecustomize(tmp_path):
    folder = tmp_path / "image"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text("import sys\nsys.stderr.write('image sitecustomize ran\\n')\n")
    return folder


def test_nested_run_chains_the_images_sitecustomize_once(tmp_path, image_sitecustomize):
    """Promise 5: `run` inside `run`: one bootstrap on PYTHONPATH, the image's sitecustomize once per process."""
    env = clean_env(PYTHONPATH=str(image_sitecustomize))
    ran = _probe(tmp_path, env, CLI, "run", "--", sys.executable, "-m", "sglang_hotfix_trtllm", "run", "--")
    assert ran.returncode == 0, ran
    assert len(_bootstrap_entries(ran.result["path"])) == 1
    # Once per Python process: the outer `run`, the inner `run`, the command.
    assert ran.stderr.count("image sitecustomize ran") == 3, ran


def test_two_installs_bootstraps_chain_the_images_sitecustomize_once(tmp_path, image_sitecustomize, target_install):
    """Promise 5: a --target install's bootstrap already on PYTHONPATH plus `run` from site-packages: no recursion."""
    other = target_install / "sglang_hotfix_trtllm" / "bootstrap"
    env = clean_env(PYTHONPATH=os.pathsep.join([str(other), str(image_sitecustomize)]))
    ran = _probe(tmp_path, env)
    assert ran.returncode == 0, ran
    assert ran.stderr.count("image sitecustomize ran") == 1, ran
    second = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sglang_hotfix_trtllm.bootstrap.sitecustomize, sitecustomize;"
            "print('RESULT:' + __import__('json').dumps(sitecustomize.__file__))",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert second.returncode == 0 and second.stderr.count("image sitecustomize ran") == 1, second.stderr


# --- 6. the wrapper is invisible to callers ---------------------------------------


def test_every_call_shape_equals_the_upstream_fix(tmp_path):
    """Promise 6: positional, keyword, self by keyword, partial, MethodType, super(): all as upstream's fix."""
    ran = run_scenario("fault", "call_shapes", cwd=tmp_path)
    assert ran.returncode == 0, ran
    assert ran.result["patched"] == PATCHED and ran.result["calls"] == 48
    assert ran.result["shapes"] == {shape: 0 for shape in ran.result["shapes"]} and len(ran.result["shapes"]) == 8


def test_rejected_calls_raise_the_same_type_error_without_writing(tmp_path):
    """Promise 6: a call the original rejects raises its TypeError, and the buffer stays untouched."""
    ran = run_scenario("fault", "rejected_calls", cwd=tmp_path)
    assert ran.returncode == 0, ran
    assert len(ran.result) == 5
    for name, outcome in ran.result.items():
        patched, original = outcome["messages"]
        assert patched is not None and patched == original, (name, outcome)
        assert outcome["buffer_sums"] == [0, 0], (name, outcome)


# --- 7. the CLI's streams and exit statuses --------------------------------------


@pytest.mark.parametrize("switches, expected", [({}, 0), ({"SGLANG_HOTFIX_TRTLLM_DISABLE": "1"}, 1)])
def test_status_piped_into_head_keeps_its_exit_status(tmp_path, switches, expected):
    """Promise 7: when the reader of stdout is gone before status writes (`status | head` on a
    long report, here `| true`), pipefail sees status's own exit status and no traceback."""
    env = clean_env(**switches)
    ran = subprocess.run(
        ["bash", "-c", 'set -o pipefail; "$0" status | true', CLI],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert ran.returncode == expected and "Traceback" not in ran.stderr and "Exception" not in ran.stderr, ran.stderr


@pytest.mark.parametrize("case", ["unknown_code", "garbage_switches", "wrapt_missing"])
def test_status_json_with_stderr_closed_is_only_json(tmp_path, case, installed_backend_source):
    """Promise 7: with fd 2 closed, nothing but the JSON document reaches stdout."""
    if case == "unknown_code":
        path = tmp_path / "trtllm_mha_backend.py"
        path.write_text(variants.with_renamed_key(installed_backend_source))
        args, env = ["--source", str(path)], clean_env()
    elif case == "garbage_switches":
        args, env = [], clean_env(SGLANG_HOTFIX_TRTLLM_STRICT="maybe")
    else:
        args, env = [], clean_env(PYTHONPATH=shadow_wrapt(tmp_path, "raise ImportError('simulated: no wrapt')"))
    ran = subprocess.run(
        ["bash", "-c", 'exec 2>&-; exec "$0" status --json "$@"', CLI] + args,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    report = json.loads(ran.stdout)  # raises if anything else is there
    assert ran.returncode == (0 if case == "garbage_switches" else 2), report


# --- Round 2 -------------------------------------------------------------------
# Cases of the second Trust round, each seen failing on 0.3.0 (the composition
# and never-raise classes: test_faults_composition.py; allow-list routes:
# test_faults_routes.py).


def test_a_hotfix_line_into_a_broken_pipe_never_changes_pythons_exit_status(tmp_path):
    """Class 5: the hotfix's own warning (here: the watched name holds a stand-in, which is not
    SGLang's code) written to a piped stderr whose reader is gone, default buffering: exit 0, not 120."""
    env = clean_env(PYTHONPATH=_watched_stand_in(tmp_path))
    code, stdout, stderr = _start(sys.executable, "open", tmp_path, env=env, code=WATCHED_IMPORT)
    assert code == 0 and "code not recognised" in stderr  # the line is written when it can be
    code, stdout, _ = _start(sys.executable, "broken_pipe_buffered", tmp_path, env=env, code=WATCHED_IMPORT)
    assert (code, stdout) == (0, "imported\n")


def test_the_startup_finder_speaks_the_finder_protocol_by_keyword(tmp_path):
    """Class 6: find_spec(fullname, path=None, target=None), positionally or by keyword."""
    code = (
        "import sys, json; f = sys.meta_path[0]; w = 'sglang.srt.layers.attention.trtllm_mha_backend';"
        "calls = [f.find_spec('json', path=None), f.find_spec(fullname='json', path=None, target=None),"
        " f.find_spec('json', None, None), f.find_spec(fullname=w, path=__import__(w[:w.rindex('.')], "
        "fromlist=['x']).__path__)];"
        "print('RESULT:' + json.dumps([c is None for c in calls] + [type(calls[3].loader).__name__]))"
    )
    ran = run_python(["-c", code], cwd=tmp_path, env=clean_env(PYTHONPATH=_watched_stand_in(tmp_path)))
    assert ran.returncode == 0, ran
    assert ran.result == [True, True, True, False, "HotfixLoader"]


APPLY_DURING_IMPORT = "import sglang_hotfix_trtllm\nARMED = sglang_hotfix_trtllm.apply()\n"


@pytest.mark.parametrize("armed_at_start", [True, False], ids=["pth_armed", "python_dash_S"])
def test_apply_while_the_backend_is_still_executing_waits_for_its_import(
    tmp_path, sglang_copy, installed_backend_source, venv_site_packages, armed_at_start
):
    """Class 4: a module the backend imports calls apply(). The half-executed module is not
    judged (0.3.0: two false "could not patch" warnings; in strict mode the import stopped):
    once its import completes, both records are applied, once, without a warning."""
    future = "from __future__ import annotations\n"
    assert installed_backend_source.count(future) == 1
    root = sglang_copy(installed_backend_source.replace(future, future + "import apply_during_import\n"))
    helper = tmp_path / "helper"
    helper.mkdir()
    (helper / "apply_during_import.py").write_text(APPLY_DURING_IMPORT)
    (helper / "imported_next.py").write_text("")  # what the host imports next (SGLang imports on)
    check = (
        "import json, sys; import sglang.srt.layers.attention.trtllm_mha_backend as b; import imported_next;"
        "d = b.TRTLLMHAAttnBackend.__dict__;"
        "print('RESULT:' + json.dumps([type(d[m]).__name__ for m in "
        "('init_forward_metadata_capture_cuda_graph', '__init__')]))"
    )
    if armed_at_start:
        ran = run_python(
            ["-c", check],
            cwd=tmp_path,
            env=clean_env(PYTHONPATH=os.pathsep.join((str(helper), str(root))), SGLANG_HOTFIX_TRTLLM_STRICT="1"),
        )
    else:  # no .pth read: apply() arms the hook from inside the import
        prefix = "import sys; sys.path[1:1] = [%r, %r, %r]; " % (str(helper), str(root), venv_site_packages)
        ran = run_python(["-S", "-c", prefix + check], cwd=tmp_path, env=clean_env(SGLANG_HOTFIX_TRTLLM_STRICT="1"))
    assert ran.returncode == 0, ran
    assert ran.result == [PATCHED, PATCHED]
    lines = ran.hotfix_lines(record=None)
    assert [line for line in lines if "WARNING" in line] == [], lines
    assert sum("INFO: patched" in line for line in lines) == len(applied_record_names()), lines


def _pr25103_unknown(text):
    """0.5.12's file with a reader pr25103 does not know (pr26521 stays affected)."""
    old = "    def _bind_swa_page_table(\n"
    assert text.count(old) == 1
    return text.replace(old, "    def _peek(self):\n        return self._swa_kv_pool\n\n" + old)


def test_a_disabled_record_with_unknown_code_is_off_in_status_and_in_the_process(
    tmp_path, sglang_copy, installed_backend_source
):
    """Class 7: the switch is read before any verdict is acted on: the process stands aside
    silently, and status says the record is off (exit 1, not the unknown-code error 2)."""
    root = sglang_copy(_pr25103_unknown(installed_backend_source))
    env = clean_env(PYTHONPATH=str(root), SGLANG_HOTFIX_TRTLLM_DISABLE="pr25103")
    shown = status_json(env=env, cwd=tmp_path)
    report, code, stderr = shown.flat(), shown.returncode, shown.stderr
    pr25103_report = report["hotfixes"][1]
    assert pr25103_report["verdict"] == "unknown" and pr25103_report["would_patch"] is False
    assert "names pr25103" in pr25103_report["would_patch_reason"] and code == 1, (report, stderr)
    ran = run_scenario("fault", "describe_or_error", env=env, cwd=tmp_path)
    assert ran.result["attribute_type"] == PATCHED  # pr26521, still on
    assert ran.hotfix_lines(record="pr25103") == [
        line for line in ran.hotfix_lines(record="pr25103") if "init_forward" in line
    ]


def test_a_namespace_package_at_the_backends_name_is_not_applicable_in_status_and_in_the_process(tmp_path, sglang_copy):
    """Class 7: a folder without __init__.py at the module's name holds no code of SGLang's:
    both records are not-applicable (exit 0), and importing it (apply() included) says nothing."""
    root = sglang_copy("")
    backend = root / "sglang" / TARGET_RELATIVE
    backend.unlink()
    backend.with_suffix("").mkdir()
    env = clean_env(PYTHONPATH=str(root))
    shown = status_json(env=env, cwd=tmp_path)
    report, code = shown.flat(), shown.returncode
    assert [r["verdict"] for r in report["hotfixes"]] == ["not-applicable"] * len(record_names()), report
    assert code == 0
    assert "namespace package" in report["reason"]
    ran = run_python(
        [
            "-c",
            "import sglang.srt.layers.attention.trtllm_mha_backend as b, sglang_hotfix_trtllm as h;"
            "h.apply(); print('RESULT:' + str(b.__file__ is None).lower())",
        ],
        cwd=tmp_path,
        env=env,
    )
    assert ran.returncode == 0 and ran.result is True, ran
    assert ran.hotfix_lines(record=None) == []


def test_a_finder_whose_unknown_attributes_raise_leaves_the_hotfix_to_the_plugin_loader(tmp_path, venv_site_packages):
    """Decided in 0.4.0 (docs/design.md, Limits): another .pth's finder that raises from
    __getattr__ stops the .pth line (site prints it; guarding costs 0.3 % of every start), and
    apply() (what SGLang's plugin loader calls) still arms the hook. The line runs as site runs it."""
    code = (
        "import sys, json\n"
        "class Hostile:\n"
        "    def find_spec(self, fullname, path=None, target=None):\n"
        "        return None\n"
        "    def __getattr__(self, name):\n"
        "        raise RuntimeError('hostile finder: ' + name)\n"
        "sys.meta_path.insert(0, Hostile())\n"
        "try:\n"
        "    exec(open(%r).read(), {})\n"
        "    line = 'ran'\n"
        "except RuntimeError as error:\n"
        "    line = str(error)\n"
        "import sglang_hotfix_trtllm, sglang_hotfix_trtllm_autoload as a\n"
        "armed_before = a.is_installed()\n"
        "print('RESULT:' + json.dumps([line, armed_before, sglang_hotfix_trtllm.apply(), a.is_installed()]))\n"
        % os.path.join(venv_site_packages, "sglang_hotfix_trtllm.pth")
    )
    ran = run_python(["-S", "-c", "import sys; sys.path.append(%r)\n" % venv_site_packages + code], cwd=tmp_path)
    assert ran.returncode == 0, ran
    assert ran.result == ["hostile finder: sglang_hotfix_trtllm_finder", False, True, True]


# Found by a hostile review of round 2's own change (each seen failing first).

AFTER_IMPORT_LEAVES_THE_NEXT_FINDER = 'import sys, importlib.machinery, importlib.util\nimport sglang_hotfix_trtllm\nN = "sglang.srt.layers.attention.trtllm_mha_backend"\nclass Custom:  # a foreign finder placed first (pytest\'s rewriter, typeguard/beartype hooks insert at 0)\n    @classmethod\n    def find_spec(cls, fullname, path=None, target=None):\n        if fullname == "only_here":\n            return importlib.machinery.ModuleSpec(fullname, Custom)\n    @staticmethod\n    def create_module(spec): return None\n    @staticmethod\n    def exec_module(m): m.x = 1\nclass Trigger:\n    done = False\n    @classmethod\n    def find_spec(cls, fullname, path=None, target=None):\n        m = sys.modules.get(N)\n        if not cls.done and m is not None and getattr(m.__spec__, "_initializing", False):\n            cls.done = True; sglang_hotfix_trtllm.apply()\nsys.meta_path.insert(0, Custom); sys.meta_path.insert(1, Trigger)\nimport sglang.srt.layers.attention.trtllm_mha_backend\ntry:\n    import only_here\n    outcome = "imported"\nexcept Exception as e:\n    outcome = "%s: %s" % (type(e).__name__, e)\nimport json\nd = sys.modules[N].TRTLLMHAAttnBackend.__dict__\nprint("RESULT:" + json.dumps([outcome, type(d["__init__"]).__name__]))\n'  # noqa: E501 (a script, verbatim)

AFTER_IMPORT_HANDS_OVER_ONCE = 'import sys\nimport sglang_hotfix_trtllm, sglang_hotfix_trtllm.engine as E\nN = "sglang.srt.layers.attention.trtllm_mha_backend"\ncalls = []\norig = E.on_module_imported\ndef counting(module, name=None):\n    calls.append(name); return orig(module, name)\nE.on_module_imported = counting\nclass Trigger:\n    done = False\n    @classmethod\n    def find_spec(cls, fullname, path=None, target=None):\n        m = sys.modules.get(N)\n        if not cls.done and m is not None and getattr(m.__spec__, "_initializing", False):\n            cls.done = True\n            sglang_hotfix_trtllm.apply()\n        return None\nsys.meta_path.insert(1, Trigger)\nimport sglang.srt.layers.attention.trtllm_mha_backend\nimport json  # any later import\nimport email.mime.text\nimport json\nprint("RESULT:" + json.dumps(len(calls)))\n'  # noqa: E501 (a script, verbatim)

REMOVE_UNDER_A_TEMPORARY_REPLACEMENT = 'import sys\nfrom unittest import mock\nimport sglang_hotfix_trtllm, sglang_hotfix_trtllm.patch as P\nfrom sglang_hotfix_trtllm.records import pr26521\nimport sglang.srt.layers.attention.trtllm_mha_backend as m\nC = m.TRTLLMHAAttnBackend\nwith mock.patch.object(C, "init_forward_metadata_capture_cuda_graph", lambda *a, **k: None):\n    removed = sglang_hotfix_trtllm.remove()\nattr = C.__dict__["init_forward_metadata_capture_cuda_graph"]\nback = [removed, type(attr).__name__, attr._self_joined(), P.is_patched(pr26521.HOTFIX, C)]\nsglang_hotfix_trtllm.apply()  # in force again, and recorded again\nagain = [P.is_patched(pr26521.HOTFIX, C), sglang_hotfix_trtllm.remove(), P.is_patched(pr26521.HOTFIX, C)]\nimport json\nprint("RESULT:" + json.dumps(back + again))\n'  # noqa: E501 (a script, verbatim)


def test_the_finder_waiting_for_a_half_executed_backend_never_makes_python_skip_the_next_finder(tmp_path):
    """_AfterImport took itself off sys.meta_path inside a lookup: the import system, iterating
    that list, skipped the next finder, and an unrelated import failed (ModuleNotFoundError)."""
    ran = run_python(["-c", AFTER_IMPORT_LEAVES_THE_NEXT_FINDER], cwd=tmp_path)
    assert ran.returncode == 0, ran
    assert ran.result == ["imported", PATCHED]


def test_a_backend_apply_found_half_executed_is_handed_to_the_engine_once(tmp_path):
    """The hook's own loader and _AfterImport both handed it over (decide and classify ran twice)."""
    ran = run_python(["-c", AFTER_IMPORT_HANDS_OVER_ONCE], cwd=tmp_path)
    assert ran.returncode == 0, ran
    assert ran.result == 1


def test_remove_while_a_temporary_replacement_sits_there_leaves_nothing_active_and_unrecorded(tmp_path):
    """mock.patch.object replaced the method, remove() ran, the mock put ours back: 0.4.0's first
    cut left ours active while is_patched said False and remove() could not reach it."""
    ran = run_python(["-c", REMOVE_UNDER_A_TEMPORARY_REPLACEMENT], cwd=tmp_path)
    assert ran.returncode == 0, ran
    # The first remove() restores every method but the one the mock holds; the second, all of them.
    every = len(wrapped_methods())
    assert ran.result == [every - 1, PATCHED, False, False, True, every, False]
