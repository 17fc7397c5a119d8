"""`sglang-hotfix-trtllm status`: the operator's view, without importing SGLang."""

import json
import os
import subprocess
import sys

import pytest

import variants
from conftest import clean_env, record_names, run_cli, run_python, sglang_tree, status_json
from sglang_hotfix_trtllm.records import catalog


def test_status_reports_affected_and_protected():
    ran = status_json()
    assert ran.returncode == 0, ran.stderr
    report = ran.flat()
    assert report["verdict"] == "affected"
    assert report["sglang_version"] == "0.5.12"
    assert report["would_patch"] is True
    assert report["startup_file"].endswith("sglang_hotfix_trtllm.pth")
    assert report["entry_point_installed"] is True


def test_status_reads_the_plugin_entry_points_once_for_every_record():
    # Each lookup reads every installed distribution's metadata; status asks for each record.
    script = (
        "import importlib.metadata as m, json, sys\n"
        "asked = []\n"
        "real = m.entry_points\n"
        "m.entry_points = lambda **kw: asked.append(kw) or real(**kw)\n"
        "from sglang_hotfix_trtllm import cli\n"
        "try:\n"
        "    cli.main(['status', '--json'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(asked), file=sys.stderr)\n"
    )
    ran = run_python(["-c", script])
    asked = json.loads(ran.stderr.strip().splitlines()[-1])
    assert asked.count({"group": "sglang.srt.plugins"}) == 1, asked


def test_status_exits_1_when_affected_but_disabled():
    ran = status_json(env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE="1"))
    assert ran.returncode == 1
    report = ran.flat()
    assert report["would_patch"] is False and "SGLANG_HOTFIX_TRTLLM_DISABLE" in report["would_patch_reason"]


def test_status_source_on_a_fixed_file_says_fixed_and_exits_0(tmp_path, installed_backend_source):
    path = tmp_path / "trtllm_mha_backend.py"
    path.write_text(variants.fixed_source_text(installed_backend_source))
    ran = status_json("--source", str(path))
    assert ran.flat()["verdict"] == "fixed"
    # A file judged alone has no FlashInfer beside it: FlashInfer's own kernel bugs, which 0.5.12's
    # code reaches, are reported (exit 1) until accepted by name; everything else is all right.
    kernel_bugs = [h.name for h in catalog.HOTFIXES if h.flashinfer_fix is not None]
    assert ran.returncode == 1 and {
        r["hotfix"] for r in ran.report["hotfixes"] if r["verdict"] == "unrepairable"
    } == set(kernel_bugs)
    accepted = status_json("--source", str(path), "--accept", ",".join(kernel_bugs))
    assert accepted.returncode == 0, accepted.report


def test_status_of_unreadable_source_exits_2_with_one_line(tmp_path):
    path = tmp_path / "trtllm_mha_backend.py"
    path.write_bytes(b"def broken(:\n")
    ran = run_cli("status", "--source", str(path))
    assert ran.returncode == 2
    lines = ran.stderr.strip().splitlines()  # one for the file, naming every record that gives it
    assert len(lines) == 1 and lines[0].split(": ")[1] == ", ".join(record_names()) and "unknown" in lines[0], lines


def test_status_does_not_import_sglang_or_torch(tmp_path):
    # It does import wrapt, as the import hook will before wrapping: whether
    # wrapt imports is part of the answer (test_faults.py's wrapt cases).
    ran = run_python(["-X", "importtime", "-m", "sglang_hotfix_trtllm", "status"], cwd=tmp_path)
    assert ran.returncode == 0
    imported = [line.split("|")[-1].strip() for line in ran.stderr.splitlines() if line.startswith("import time:")]
    assert "sglang_hotfix_trtllm.status" in imported  # the check can see what it looks for
    heavy = [m for m in imported if m.split(".")[0] in ("torch", "sglang")]
    assert heavy == []


def test_python_m_status_matches_the_console_script(tmp_path):
    ran = status_json(python=sys.executable, cwd=tmp_path)
    assert ran.returncode == 0 and ran.report == status_json().report


def test_every_json_key_is_documented_in_the_reference():
    from conftest import REPO

    readme = (REPO / "docs" / "reference.md").read_text()
    keys = set(status_json().report)
    undocumented = sorted(k for k in keys if "`%s`" % k not in readme)
    assert undocumented == []


def test_status_exits_1_when_excluded_by_sglang_plugins():
    ran = status_json(env=clean_env(SGLANG_PLUGINS="another_plugin"))
    assert ran.returncode == 1 and "SGLANG_PLUGINS" in ran.flat()["would_patch_reason"]


def test_status_exits_2_for_unknown_installed_code(tmp_path, installed_backend_source):
    # An SGLang whose backend is not recognised, first on PYTHONPATH.
    root = sglang_tree(tmp_path / "sglang_copy", variants.with_renamed_key(installed_backend_source))
    ran = status_json(env=clean_env(PYTHONPATH=str(root)))
    assert ran.returncode == 2 and ran.flat()["verdict"] == "unknown"
    assert len(ran.stderr.strip().splitlines()) == 1


def test_status_when_sglang_is_absent(tmp_path, bare_python, target_install):
    ran = status_json(python=bare_python, env=clean_env(PYTHONPATH=str(target_install)), cwd=tmp_path)
    # Issue 37, item 1: not NOTHING TO DO (exit 0) but CANNOT PATCH (exit 2), naming the interpreter.
    assert ran.returncode == 2
    report = ran.flat()
    assert report["verdict"] == "not-applicable" and report["sglang_version"] is None
    assert report["sglang_installed"] is False and report["exit_status"] == 2
    assert report["headline"].startswith("CANNOT PATCH: SGLang is not installed for this Python")


def test_status_of_a_target_install_names_the_startup_file_python_reads(tmp_path, target_install, venv_site_packages):
    # The interpreter is the test venv's, but the plugin imported is the --target copy. The venv's
    # own install's .pth is read at every start (issue 37, item 13: status said "inactive", naming
    # the --target copy's unread one); without it only the plugin loader would patch
    # (test_operators: a bare Python with the --target copy).
    ran = run_python(
        ["-s", "-m", "sglang_hotfix_trtllm", "status", "--json"],
        cwd=tmp_path,
        env=clean_env(PYTHONPATH=str(target_install)),
    )
    report = ran.flat()
    assert report["plugin_location"] == str(target_install)
    assert report["startup_file_active"] is True and report["startup_file"].startswith(venv_site_packages)
    assert report["would_patch"] is True and report["covered_processes"] == "every-process"


def test_bad_arguments_exit_64_never_an_answer_of_status():
    """Issue 48, item 3: usage errors exited 2, as CANNOT PATCH does; a second --source silently
    replaced the first."""
    ran = run_cli("frobnicate")
    assert ran.returncode == 64 and "usage" in ran.stderr
    ran = run_cli("status", "--source", "a", "--source", "b")
    assert ran.returncode == 64 and "--source given twice ('a' and 'b')" in ran.stderr and ran.stdout == ""


def test_a_bad_option_of_a_verb_prints_that_verbs_usage():
    """Issue 30, item 6: `status --bogus` printed the top-level usage."""
    ran = run_cli("status", "--bogus")
    assert ran.returncode == 64 and ran.stdout == ""
    assert "usage: sglang-hotfix-trtllm status" in ran.stderr and "unrecognized arguments: --bogus" in ran.stderr


def test_an_empty_source_path_is_a_path_problem_not_the_installed_sglang():
    """Issue 30, item 2: `status --source ""` reported the installed environment (PROTECTED, exit 0)."""
    ran = run_cli("status", "--source", "")
    assert ran.returncode == 3 and ran.stdout == ""
    assert "status --source: an empty path names no file or folder" in ran.stderr


@pytest.mark.parametrize("redirect, words", [(">&-", "stdout is closed"), (">/dev/full", "cannot write the result")])
@pytest.mark.parametrize("verb", [["status"], ["status", "--json"], ["verify"]])
def test_the_exit_status_is_the_results_whatever_happens_to_stdout(redirect, words, verb):
    """Issue 30, item 3: with stdout closed or full, status printed a traceback and exited 1."""
    import shlex

    from conftest import CLI

    expected = run_cli(*verb, timeout=600)
    ran = subprocess.run(
        ["bash", "-c", "%s %s %s" % (shlex.quote(str(CLI)), " ".join(verb), redirect)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=600,
    )
    assert ran.returncode == expected.returncode, ran.stderr
    assert "Traceback" not in ran.stderr and "Exception ignored" not in ran.stderr, ran.stderr
    assert ran.stderr.count(words) == 1, ran.stderr


def test_status_in_a_python_without_sglang_says_so_and_fails(tmp_path):
    """Issue 37, item 1: the plugin installed with another interpreter's pip said NOTHING TO DO, exit
    0, and a Dockerfile's `&& sglang-hotfix-trtllm status` shipped an unprotected image. A Python
    that finds no sglang package (here: no site-packages at all, the plugin on the path by hand)."""
    import shutil

    import sglang_hotfix_trtllm

    plugin = tmp_path / "plugin"
    shutil.copytree(os.path.dirname(sglang_hotfix_trtllm.__file__), plugin / "sglang_hotfix_trtllm")
    import sglang_hotfix_trtllm_autoload  # the startup module, a top-level sibling of the package

    shutil.copy(sglang_hotfix_trtllm_autoload.__file__, plugin)
    code = "import sys; sys.path.insert(0, %r); from sglang_hotfix_trtllm import cli; sys.exit(cli.main(%r))"
    ran = subprocess.run(
        [sys.executable, "-S", "-c", code % (str(plugin), ["verify"])],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(tmp_path),
    )
    assert ran.returncode == 2 and "cannot verify: SGLang is not installed for this Python" in ran.stderr, ran.stderr
    for arguments in (["status"], ["status", "--json"]):
        ran = subprocess.run(
            [sys.executable, "-S", "-c", code % (str(plugin), arguments)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=str(tmp_path),
        )
        assert ran.returncode == 2, ran.stdout + ran.stderr
        first = ran.stdout.splitlines()[0] if arguments == ["status"] else json.loads(ran.stdout)["headline"]
        assert first.startswith("CANNOT PATCH: SGLang is not installed for this Python (%s" % sys.executable), first


def test_a_wrapt_py_in_the_current_folder_is_cannot_patch_and_the_process_blames_it(tmp_path):
    """Issue 48, item 3: a ``wrapt.py`` in the folder a server starts in shadows the wrapt package
    for ``python -m`` processes; `status` (a console script, which does not search that folder) said
    PROTECTED, and the process logged an internal error of the hotfix and ran unpatched."""
    (tmp_path / "wrapt.py").write_text("# someone's script\n")
    ran = status_json(cwd=str(tmp_path))
    assert ran.returncode == 2 and ran.report["headline"].startswith("CANNOT PATCH"), ran.report["headline"]
    assert "wrapt.py shadows the wrapt package" in ran.report["headline"]
    imported = run_python(["-c", "import sglang.srt.layers.attention.trtllm_mha_backend"], cwd=tmp_path)
    assert imported.returncode == 0, imported
    said = [line for line in imported.hotfix_lines() if "pr26521" in line]
    assert len(said) == 1 and "is not the wrapt package" in said[0] and "internal error" not in said[0], said


# --- issue 48, item 3: two copies of the plugin; an SGLang in the current folder ------------------------


def _plugin_copy(target_install, folder, version):
    """The --target copy with its version changed (an older copy left on PYTHONPATH)."""
    import shutil

    # Without the compiled files: the version is as long as the one it replaces, and written within
    # the same second as the install, the edited __init__.py has the size and mtime its .pyc
    # recorded, so Python would run the .pyc of the current version.
    shutil.copytree(target_install, folder, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    init = folder / "sglang_hotfix_trtllm" / "__init__.py"
    text = init.read_text()
    init.write_text(text.replace('__version__ = "%s"' % _version(), '__version__ = "%s"' % version))
    for info in folder.glob("sglang_hotfix_trtllm-*.dist-info"):
        info.rename(folder / ("sglang_hotfix_trtllm-%s.dist-info" % version))
    return folder


def _version():
    import sglang_hotfix_trtllm

    return sglang_hotfix_trtllm.__version__


def test_two_copies_in_different_versions_are_said_and_are_not_a_clean_protected(tmp_path, target_install):
    """Issue 48, item 3: pip's copy in site-packages and an older --target copy on PYTHONPATH
    (importlib.metadata sees both): status said PROTECTED with no word of it."""
    old = _plugin_copy(target_install, tmp_path / "old", "0.14.0")
    ran = status_json(cwd=tmp_path, env=clean_env(PYTHONPATH=str(old)))
    document = ran.report
    assert ran.returncode == 3 and document["exit_status"] == 3, document["headline"]
    headline = document["headline"]
    assert headline.startswith("CANNOT TELL: 2 copies of this plugin, in different versions: 0.14.0 at %s" % old)
    assert "this command runs it, as `python -m sglang_hotfix_trtllm` does here" in headline
    assert "%s at %s (site-packages)" % (_version(), document["startup_file"].rsplit("/", 1)[0]) in headline
    assert "one started with this environment's PYTHONPATH: 0.14.0 %s" % old in headline
    assert "what this copy (0.14.0) says: PROTECTED: " in headline
    assert [c["version"] for c in document["plugin_copies"]] == ["0.14.0", _version()]


def test_two_copies_of_one_version_are_said_without_failing(tmp_path, target_install):
    ran = run_cli("status", cwd=tmp_path, env=clean_env(PYTHONPATH=str(target_install)))
    assert ran.returncode == 0 and ran.stdout.startswith("PROTECTED: "), ran
    said = [line for line in ran.stdout.splitlines() if line.startswith("2 copies of this plugin: ")]
    assert len(said) == 1 and str(target_install) in said[0], ran.stdout


@pytest.mark.parametrize("where", [("sglang",), ("python", "sglang")])
def test_an_sglang_in_the_current_folder_is_judged_as_what_processes_started_there_import(
    tmp_path, where, installed_backend_path
):
    """Issue 48, item 3: run from a folder holding an SGLang (an unpacked wheel, a checkout), status
    judged the installed release alone, while `python -m` processes started there import the folder's."""
    import release_selection

    release = release_selection.release_dir("0.5.19") / "sglang" / "srt" / "layers" / "attention"
    root = tmp_path.joinpath(*where[:-1])
    sglang_tree(
        root,
        (release / "trtllm_mha_backend.py").read_text(encoding="utf-8"),
        link_installed=installed_backend_path.parents[3],
    )
    package = root / "sglang"
    # ./sglang: processes started here import it; a checkout's ./python/sglang: those started in ./python
    started_in = "this folder (%s)" % tmp_path if where == ("sglang",) else str(root)
    for ran in (run_cli("status", cwd=tmp_path), run_cli("status", python=sys.executable, cwd=tmp_path)):
        first = ran.stdout.splitlines()[0]
        assert ran.returncode == 1, ran
        assert first.startswith(
            "NOT PROTECTED: processes started in %s import %s before the installed SGLang; there: "
            "NOT PROTECTED: SGLang 0.5.12 at %s: record xqa_draft_extend would run unpatched"
            % (started_in, package, package)
        ), first
        assert "; the installed SGLang: PROTECTED: SGLang 0.5.12 has the bugs of records pr26521," in first
    document = status_json(cwd=tmp_path).report
    here = document["current_folder_sglang"]
    assert here["location"] == str(package) and here["exit_status"] == 1
    assert {r["hotfix"]: r["verdict"] for r in here["hotfixes"]}["xqa_draft_extend"] == "unrepairable"
