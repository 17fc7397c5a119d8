"""What an operator meets: the CLI by convention, `status --source` on folders,
offline installs, `run` never shadowing the image's packages, the wheel's
contents."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

import release_selection
import variants
from sglang_hotfix_trtllm import __version__
from sglang_hotfix_trtllm.records import catalog
from conftest import (
    PATCHED,
    REPO,
    build_wheel,
    SCENARIO_SCRIPTS,
    TARGET_RELATIVE,
    clean_env,
    exclusive,
    record_names,
    run_cli,
    run_python,
    run_scenario,
    sglang_tree,
    status_json,
)

# --- status: one actionable line, readable values, a format version ----------


def test_human_status_opens_with_one_line_to_act_on():
    ran = run_cli("status")
    first = ran.stdout.splitlines()[0]
    assert ran.returncode == 0 and first.startswith("PROTECTED: SGLang 0.5.12 has the bug")
    ran = run_cli("status", env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE="1"))
    assert (
        ran.returncode == 1
        and ran.stdout.startswith("NOT PROTECTED: ")
        and "SGLANG_HOTFIX_TRTLLM_DISABLE" in ran.stdout.splitlines()[0]
    )


def _without_code(text):
    """The text without ``--verbose``'s diffs of edited methods (Python code, shown as code)."""
    kept, in_diff = [], False
    for line in text.splitlines():
        if line == "the code it runs, against SGLang's:":
            in_diff = True
        elif in_diff and line[:1] not in ("-", "+", "@", " "):
            in_diff = False
        if not in_diff:
            kept.append(line)
    return "\n".join(kept)


def test_human_status_shows_no_python_reprs():
    for verbose in ((), ("--verbose",)):
        out = _without_code(run_cli("status", *verbose).stdout)
        assert "{" not in out and "None" not in out and "True" not in out and "False" not in out
    assert "disabled: no" in out  # the verbose blocks: every switch, as a person reads it


def test_plain_status_is_short_and_verbose_has_every_report():
    """Issue 37 item 10: plain ``status`` printed every record's whole report (about 150 lines, 235
    with nine records). Now: the first line, one line per record (name, verdict, what a new process
    does), the environment in one line, and how to see the rest; ``--verbose`` prints the blocks
    with the same first line and exit status."""
    from sglang_hotfix_trtllm.records import catalog

    short = run_cli("status", env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE="pr31667"))
    verbose = run_cli("status", "--verbose", env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE="pr31667"))
    lines = short.stdout.splitlines()
    assert short.returncode == verbose.returncode == 1
    assert lines[0] == verbose.stdout.splitlines()[0] and lines[0].startswith("NOT PROTECTED: ")
    assert len(lines) == len(catalog.HOTFIXES) + 5, short.stdout
    rows = {line.split()[0]: line.split(None, 2)[1:] for line in lines[2 : 2 + len(catalog.HOTFIXES)]}
    assert list(rows) == [hotfix.name for hotfix in catalog.HOTFIXES]
    assert rows["pr31667"] == ["affected", "runs unpatched: SGLANG_HOTFIX_TRTLLM_DISABLE names pr31667"]
    assert rows["pr26521"] == ["affected", "will be patched"] and rows["pr17732"][0] == "fixed"
    assert "switches set: disabled_records: pr31667" in lines[-2] and "--verbose" in lines[-1]
    for hotfix in catalog.HOTFIXES:
        assert "\nhotfix" in verbose.stdout and ("hotfix %s" % hotfix.name) in " ".join(verbose.stdout.split())


def test_json_status_carries_a_format_version():
    assert status_json().report["format_version"] == 2


def test_json_status_top_level_is_the_answer_and_the_environment_not_a_record():
    """Issue 37 item 3: format 1's top level was pr26521's report ("would_patch": false on 0.5.14
    while pr31667 would be patched). Format 2: the answer and the environment only."""
    report = status_json().report
    assert {"headline", "exit_status", "hotfixes", "sglang_version", "switches"} <= set(report)
    assert not {"verdict", "would_patch", "decision", "reason", "fingerprint", "hotfix"} & set(report)
    single = status_json("--source", status_json().record()["source_path"]).report
    assert not {"verdict", "would_patch", "reason", "fingerprint"} & set(single) and single["exit_status"] == 0


# --- status --source on files and folders ---------------------------------------


# Code judged alone (``--source``) with no FlashInfer beside it reaches FlashInfer's own kernel bugs
# that cannot be told away (test_flashinfer_records): these tests are about ``--source``'s other
# answers, so those two records are accepted by name here, as an operator would (still named).
KERNEL_BUGS = ",".join(h.name for h in catalog.HOTFIXES if h.flashinfer_fix is not None)


@pytest.fixture(autouse=True)
def flashinfers_kernel_bugs_accepted(monkeypatch):
    monkeypatch.setenv("SGLANG_HOTFIX_TRTLLM_ACCEPT", KERNEL_BUGS)


@pytest.fixture
def image_root(tmp_path, installed_backend_source):
    """An image-like tree: two SGLang installs (affected and fixed) and unrelated files."""
    root = tmp_path / "image"
    for site, text in (
        ("usr/lib/python3.12/site-packages", installed_backend_source),
        ("opt/sglang/python", variants.fixed_source_text(installed_backend_source)),
    ):
        sglang_tree(root / site, text)
    (root / "etc").mkdir()
    (root / "etc" / "hostname").write_text("x\n")
    return root


def test_source_folder_reports_every_backend_file_under_it(image_root):
    ran = status_json("--source", str(image_root))
    report = ran.report
    assert ran.returncode == 0 and report["format_version"] == 2 and "sources" not in report
    assert report["root"] == str(image_root) and report["unreadable"] == []
    assert sorted(r["verdict"] for r in ran.record("pr26521")["sources"]) == ["affected", "fixed"]
    for record in report["hotfixes"]:
        assert all(r["source_path"].startswith(str(image_root)) for r in record["sources"])


def test_a_folder_scan_parses_each_backend_file_once(image_root, monkeypatch, capsys):
    """Issue 37 item 4: the command asks record by record across every file, and the analysis
    keeps one file's tree: an image root's scan parsed each file once per record (nine times).
    Each file is now parsed once, with the same verdicts as each record's own assessment."""
    from sglang_hotfix_trtllm import cli, detect
    from sglang_hotfix_trtllm.records import catalog

    parsed, parse = [], detect.ParsedSource.parse

    def counting(self):
        if self.tree is None:
            parsed.append(self.path)
        return parse(self)

    monkeypatch.setattr(detect.ParsedSource, "parse", counting)
    assert cli.main(["status", "--source", str(image_root), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(parsed) == len(set(parsed)) == 2, parsed
    for record in report["hotfixes"]:
        hotfix = next(h for h in catalog.HOTFIXES if h.name == record["hotfix"])
        for source in record["sources"]:
            alone = detect.beside_its_flashinfer(hotfix, detect.assess_source(hotfix, source["source_path"]))
            assert source["verdict"] == alone.verdict.value


def test_source_folder_with_unknown_code_exits_2(image_root, installed_backend_source):
    bad = (
        sglang_tree(image_root / "srv", variants.with_renamed_key(installed_backend_source))
        / "sglang"
        / TARGET_RELATIVE
    )
    ran = run_cli("status", "--source", str(image_root))
    assert ran.returncode == 2 and "unknown" in ran.stderr and str(bad) in ran.stderr
    # The file's own line names it (it read "CANNOT PATCH: record …" without the path).
    assert any(line.startswith("CANNOT PATCH: %s: record " % bad) for line in ran.stdout.splitlines()), ran.stdout


@pytest.mark.parametrize("case", ["missing", "empty_folder", "unreadable"])
def test_source_paths_that_cannot_be_examined_exit_3_with_their_own_message(tmp_path, case, installed_backend_source):
    if case == "missing":
        path, words = tmp_path / "nowhere", "no such file or folder"
    elif case == "empty_folder":
        path, words = tmp_path, "no trtllm_mha_backend.py under"
    else:
        if os.geteuid() == 0:
            pytest.skip("root reads any file")
        path, words = tmp_path / "trtllm_mha_backend.py", "permission denied"
        path.write_text(installed_backend_source)
        path.chmod(0)
    ran = run_cli("status", "--source", str(path))
    assert ran.returncode == 3 and ran.stdout == ""
    assert len(ran.stderr.strip().splitlines()) == 1 and words in ran.stderr


# --- conventions ------------------------------------------------------------------


def test_dash_V_works_like_version():
    assert run_cli("-V").stdout == run_cli("--version").stdout != ""


@pytest.mark.parametrize("verb", ["status", "verify", "run"])
def test_each_verb_help_has_a_description_exit_statuses_and_variables(verb):
    out = run_cli(verb, "--help").stdout
    assert "exit status" in out
    assert len(out.split("\n\n")[1].strip()) > 40  # the description paragraph
    if verb != "run":
        assert "SGLANG_HOTFIX_TRTLLM_DISABLE" in out and "SGLANG_PLUGINS" in out


def test_strict_mode_says_the_import_is_stopped(scenario, overlay_dir, installed_backend_source):
    folder = overlay_dir(variants.with_renamed_key(installed_backend_source))
    ran = scenario("overlay", folder, env=clean_env(SGLANG_HOTFIX_TRTLLM_STRICT="1"))
    assert ran.returncode != 0 and "import of sglang.srt.layers.attention.trtllm_mha_backend is stopped" in ran.stderr
    assert "SGLang runs without" not in ran.stderr


def test_allowlist_leaving_out_the_hotfix_on_affected_code_is_a_warning(scenario):
    ran = scenario("describe", env=clean_env(SGLANG_PLUGINS="some_other_plugin"))
    lines = ran.hotfix_lines()
    assert len(lines) == 1 and "WARNING: not patching" in lines[0]


# --- the wheel ----------------------------------------------------------------------


def test_a_stale_build_folder_does_not_reach_the_wheel(tmp_path):
    checkout = tmp_path / "checkout"
    with exclusive("repository-build"):  # not while another test process builds in it
        shutil.copytree(
            REPO, checkout, ignore=shutil.ignore_patterns(".venv", ".cache", ".git", ".whl", ".gpu", ".e2e", "build")
        )
    stale = checkout / "build" / "lib" / "sglang_hotfix_trtllm"
    stale.mkdir(parents=True)
    (stale / "deleted_module.py").write_text("raise SystemExit('stale')\n")
    wheel = build_wheel(checkout, tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert not any("deleted_module" in n for n in names)
    assert any(n.endswith("LICENSE") for n in names)


# --- offline install and run's precedence --------------------------------------------


@pytest.fixture
def offline_wheels(tmp_path, plugin_wheel):
    """The README's air-gapped folder: the plugin's wheel and wrapt's for this Python and platform,
    fetched ahead of time (the one step that needs an index)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    shutil.copy(plugin_wheel, wheels)
    version = "%d.%d" % sys.version_info[:2]
    platforms = ["--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64"]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", version]
        + platforms
        + ["-d", str(wheels), "wrapt>=1.14"],
        check=True,
        timeout=300,
    )
    return wheels


def test_offline_recipe_installs_with_no_index(tmp_path, offline_wheels):
    """README's air-gapped recipe: fetch the wrapt wheel for the target's Python and
    platform ahead of time, then install both with --no-index."""
    venv = tmp_path / "target-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(offline_wheels),
            "sglang-hotfix-trtllm",
        ],
        check=True,
        timeout=300,
    )
    report = status_json(python=python, cwd=tmp_path).flat()
    assert report["verdict"] == "not-applicable" and report["startup_file_active"] is True


def test_run_never_shadows_the_images_wrapt(tmp_path, bare_python, plugin_wheel, venv_site_packages):
    """A --target folder holding its own (older) wrapt, named on PYTHONPATH as the
    Kubernetes recipe does: under `run` the image's wrapt wins, and SGLang is patched with it."""
    target = tmp_path / "hotfix"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(plugin_wheel),
            "wrapt==1.17.2",
        ],
        check=True,
        timeout=300,
    )
    env = clean_env(PYTHONPATH=os.pathsep.join([str(target), venv_site_packages]))
    plain = run_scenario("scenario", "wrapt_in_use", python=bare_python, env=env, cwd=tmp_path)
    probe = [bare_python, str(SCENARIO_SCRIPTS["scenario"]), "wrapt_in_use"]
    under_run = run_cli("run", "--", *probe, python=bare_python, env=env, cwd=tmp_path, timeout=600)
    assert plain.result["wrapt_file"].startswith(str(target))  # without run, PYTHONPATH order decides
    assert under_run.returncode == 0, under_run
    assert under_run.result["wrapt_file"].startswith(venv_site_packages), under_run.result
    assert under_run.result["wrapt_version"] != "1.17.2"
    assert under_run.result["attribute_type"] == PATCHED


# --- round 2: the kill switch fails safe; one headline; which processes are covered ---


def _status(value):
    ran = status_json(env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE=value))
    document = ran.report
    return ran.returncode, {r["hotfix"]: r["decision"] for r in document["hotfixes"]}, document["headline"], ran


EVERY_RECORD = "every record"
# value -> (records off, understood)
KILL_SWITCH_SHAPES = {
    "": ((), True),
    "0": ((), True),
    "false": ((), True),
    "1": (EVERY_RECORD, True),
    "pr25103": (("pr25103",), True),
    " PR25103 , ": (("pr25103",), True),
    "pr25103,pr26521": (("pr26521", "pr25103"), True),
    "1,pr25103": (EVERY_RECORD, False),
    "pr25103,garbage": (EVERY_RECORD, False),
    "pr2510": (EVERY_RECORD, False),
    "yes please": (EVERY_RECORD, False),
}


@pytest.mark.parametrize("value", list(KILL_SWITCH_SHAPES), ids=repr)
def test_the_kill_switch_turns_off_what_it_names_and_everything_when_not_understood(value):
    """A value that is set but not fully understood turns every record off, with one
    warning naming what was not understood; status's first word matches its exit status."""
    off, understood = KILL_SWITCH_SHAPES[value]
    off = record_names() if off == EVERY_RECORD else off
    code, decisions, headline, ran = _status(value)
    assert {name for name, action in decisions.items() if action == "disabled"} == set(off)
    assert code == (1 if off else 0)
    assert headline.startswith("NOT PROTECTED: " if off else "PROTECTED: ")
    problems = ran.report["switch_problems"]
    assert (problems == []) == understood
    if not understood:
        assert "not understood" in problems[0] and "turning every record off" in problems[0]


def test_a_process_agrees_with_status_on_a_kill_switch_it_does_not_understand(scenario):
    """The process, as status predicted: both records off, one warning naming the value."""
    ran = scenario("describe", env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE="pr25103,garbage"))
    assert ran.returncode == 0, ran
    assert ran.result["attribute_type"] == "function"
    lines = ran.hotfix_lines(record=None)
    assert len(lines) == 1 and "WARNING" in lines[0] and "'garbage' is no record" in lines[0], lines


@pytest.mark.parametrize(
    "value, word, code", [("", "PROTECTED: ", 0), ("pr25103", "NOT PROTECTED: ", 1), ("1", "NOT PROTECTED: ", 1)]
)
def test_the_first_line_is_one_verdict_across_records_matching_the_exit_status(value, word, code):
    ran = run_cli("status", "--verbose", env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE=value))
    first = ran.stdout.splitlines()[0]
    assert ran.returncode == code and first.startswith(word), first
    # With --verbose each record's block follows, opened by a line naming the record.
    blocks = [line.split(":")[0] for line in ran.stdout.splitlines() if line.startswith("record ")]
    assert blocks == ["record " + name for name in record_names()]


def test_with_only_the_plugin_loader_the_headline_says_which_processes_are_covered(
    tmp_path, bare_python, target_install, venv_site_packages
):
    """A --target install on PYTHONPATH (no .pth is read there, SGLang importable): only
    SGLang's plugin loader patches. The headline says so and names `run` for the rest."""
    env = clean_env(PYTHONPATH=os.pathsep.join((str(target_install), venv_site_packages)))
    ran = status_json(python=bare_python, cwd=tmp_path, env=env)
    document = ran.report
    covered = {r["covered_processes"] for r in document["hotfixes"] if r["verdict"] == "affected"}
    assert ran.returncode == 0 and covered == {"sglang-plugin-loader-only"}
    assert "only processes started through SGLang's plugin loader" in document["headline"]
    assert "sglang-hotfix-trtllm run -- COMMAND" in document["headline"]
    # And it is true: a plain import there stays unpatched.
    code = (
        "import sglang.srt.layers.attention.trtllm_mha_backend as b;"
        "print('RESULT:' + __import__('json').dumps(type(b.TRTLLMHAAttnBackend.__dict__['__init__']).__name__))"
    )
    plain = run_python(["-c", code], cwd=tmp_path, env=env, python=bare_python)
    assert plain.result == "function", plain


def test_installed_twice_the_site_packages_startup_file_still_arms_every_process(tmp_path, target_install):
    """Issue 37, item 13: the plugin installed by pip (its .pth read at every start) and a --target
    copy first on PYTHONPATH. status named the PYTHONPATH copy's unread .pth and said only the
    plugin loader's processes were patched; the site-packages .pth arms every process."""
    env = clean_env(PYTHONPATH=str(target_install))
    ran = status_json(cwd=tmp_path, env=env)
    document = ran.report
    assert document["plugin_location"].startswith(str(target_install))
    covered = {r["covered_processes"] for r in document["hotfixes"] if r["verdict"] == "affected"}
    assert ran.returncode == 0 and covered == {"every-process"}, document["headline"]
    assert document["startup_file_active"] and not document["startup_file"].startswith(str(target_install))
    # And it is true: a plain import there is patched.
    code = (
        "import sglang.srt.layers.attention.trtllm_mha_backend as b;"
        "print('RESULT:' + __import__('json').dumps(type(b.TRTLLMHAAttnBackend.__dict__['__init__']).__name__))"
    )
    plain = run_python(["-c", code], cwd=tmp_path, env=env)
    assert plain.result == "HotfixWrapper", plain


# --- round 2: bad inputs get messages, never tracebacks ---------------------------


def test_run_with_an_empty_command_name_says_so_and_exits_127():
    ran = run_cli("run", "--", "")
    assert ran.returncode == 127 and "not a command name" in ran.stderr and "Traceback" not in ran.stderr
    assert ran.stdout == ""


@pytest.fixture
def deeply_nested(tmp_path):
    """A backend file that Python's parser cannot build an AST of (RecursionError)."""
    path = tmp_path / "deep" / "trtllm_mha_backend.py"
    path.parent.mkdir()
    path.write_text("x = " + "1+" * 200000 + "1\n")
    return path


def test_status_source_on_a_too_deeply_nested_file_is_unknown_with_a_message(deeply_nested):
    ran = status_json("--source", str(deeply_nested))
    assert ran.returncode == 2 and "Traceback" not in ran.stderr
    assert [r["verdict"] for r in ran.report["hotfixes"]] == ["unknown"] * len(record_names())
    assert "RecursionError" in ran.stderr


def test_a_folder_scan_survives_a_too_deeply_nested_file(image_root, deeply_nested):
    sglang_tree(image_root / "srv", deeply_nested.read_text())
    ran = status_json("--source", str(image_root))
    verdicts = sorted(s["verdict"] for s in ran.record()["sources"])
    assert ran.returncode == 2 and verdicts == ["affected", "fixed", "unknown"], ran.stderr


@pytest.mark.parametrize("backend_inside", [False, True])
def test_a_folder_scan_with_an_unreadable_sub_folder_gives_the_rest_and_exits_3(
    image_root, installed_backend_source, backend_inside
):
    """Issue 30, item 4: one unreadable folder stopped the scan with no verdict at all (exit 3).
    Now: the verdicts of what could be read, a line naming what could not, exit 3 (a backend may
    sit there). The tests run as root, who reads every folder: the permission error is injected
    where os.walk lists it."""
    locked = image_root / "locked"
    locked.mkdir()
    if backend_inside:  # the only backend sits in the unreadable folder: nothing to judge
        sglang_tree(locked / "srv", installed_backend_source)
        for other in image_root.iterdir():
            if other != locked:
                shutil.rmtree(other)
    code = (
        "import os, sys\n"
        "real = os.scandir\n"
        "def scandir(path='.'):\n"
        "    if os.fspath(path) == %r:\n"
        "        raise PermissionError(13, 'Permission denied', os.fspath(path))\n"
        "    return real(path)\n"
        "os.scandir = scandir\n"
        "from sglang_hotfix_trtllm.cli import main\n"
        "sys.exit(main(['status', '--source', %r, '--json']))\n" % (str(locked), str(image_root))
    )
    ran = run_python(["-c", code])
    assert ran.returncode == 3, ran
    if backend_inside:
        assert ran.stdout == "" and "cannot read %s: Permission denied" % locked in ran.stderr
        assert len(ran.stderr.strip().splitlines()) == 1, ran.stderr
        return
    report = json.loads(ran.stdout)
    first = next(r for r in report["hotfixes"] if r["hotfix"] == "pr26521")
    assert sorted(s["verdict"] for s in first["sources"]) == ["affected", "fixed"]
    assert report["unreadable"] == ["%s: Permission denied" % locked]
    assert ran.stderr.count("status --source: cannot read %s: Permission denied" % locked) == 1, ran.stderr


def test_an_empty_backend_file_is_unknown_for_every_record(tmp_path):
    """No backend class at all: both records say the same thing (0.3.0: unknown and not-applicable)."""
    path = tmp_path / "trtllm_mha_backend.py"
    path.write_text("")
    ran = status_json("--source", str(path))
    reports = ran.report["hotfixes"]
    assert ran.returncode == 2 and [r["verdict"] for r in reports] == ["unknown"] * len(record_names())
    assert all("class TRTLLMHAAttnBackend not found" in r["reason"] for r in reports)


def test_offline_init_container_recipe_installs_into_a_target_folder_with_the_network_cut(
    tmp_path, offline_wheels, bare_python
):
    """README's offline Kubernetes variant: the wrapt wheel beside the plugin's, `--no-index
    --target`, every proxy pointed at a closed port; then `run` arms the hook in the command."""
    cut = {name: "http://127.0.0.1:9" for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")}
    target = tmp_path / "opt-hotfix"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-cache-dir",
            "--no-index",
            "--find-links",
            str(offline_wheels),
            "--target",
            str(target),
            "sglang-hotfix-trtllm",
        ],
        check=True,
        timeout=300,
        env=clean_env(PIP_INDEX_URL="http://127.0.0.1:9/simple", **cut),
    )
    assert (target / "wrapt").is_dir() and (target / "sglang_hotfix_trtllm").is_dir()
    probe = "import sys, json, sglang_hotfix_trtllm_autoload as a;print('RESULT:' + json.dumps(a.is_installed()))"
    ran = run_cli(
        "run", "--", bare_python, "-c", probe, python=bare_python, cwd=tmp_path, env=clean_env(PYTHONPATH=str(target))
    )
    assert ran.returncode == 0 and ran.result is True, ran


def test_pip_show_says_what_it_is_and_where_the_records_are_listed(tmp_path):
    """Issue 30, item 8: the summary named two records long after a third came; it names none now
    and points to `status`, which lists them all."""
    summary = subprocess.run(
        [sys.executable, "-m", "pip", "show", "sglang-hotfix-trtllm"], capture_output=True, text=True, timeout=120
    ).stdout
    line = next(line for line in summary.splitlines() if line.startswith("Summary:"))
    assert "TRT-LLM MHA" in line and "sglang-hotfix-trtllm status lists them" in line
    assert re.findall(r"\bpr\d{5}\b", line) == []


def test_run_help_lists_the_variables_it_says_it_lists():
    text = run_cli("run", "--help").stdout
    for variable in ("SGLANG_HOTFIX_TRTLLM_DISABLE", "SGLANG_HOTFIX_TRTLLM_STRICT", "SGLANG_PLUGINS", "PYTHONPATH"):
        assert variable in text, variable


def _readme_command(opening):
    """The backquoted commands of the README paragraph or list item that opens with ``opening``
    (its lines joined as a reader copies them: one space where a line breaks)."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(opening))
    item = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.strip() or line.startswith("* "):
            break
        item.append(line.strip())
    return re.findall(r"`([^`]+)`", " ".join(item))


def test_uv_install_then_the_readmes_uv_removal_leaves_nothing_of_the_plugin(tmp_path, plugin_wheel):
    """Issue 30, item 7: after the README's `uv pip uninstall`, uv's byte-code of the top-level
    startup module stayed in site-packages/__pycache__ (pip's removal is clean)."""
    tool = tmp_path / "tool"
    subprocess.run([sys.executable, "-m", "venv", str(tool)], check=True, timeout=120)
    subprocess.run([str(tool / "bin" / "pip"), "install", "-q", "uv"], check=True, timeout=600)
    target = tmp_path / "target"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True, timeout=120)
    site = pathlib.Path(
        subprocess.run(
            [str(target / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    before = {p.relative_to(site) for p in site.rglob("*")}
    env = clean_env(PATH="%s:%s:%s" % (target / "bin", tool / "bin", os.environ["PATH"]))
    (install,) = _readme_command("With uv,")
    # run inside the container (issue 48: `which` in the host's shell named the host's python)
    prefix = "docker exec sglang sh -c '"
    assert install.startswith(prefix) and install.endswith("'") and install.count("'") == 2, install
    install = install[len(prefix) : -1]
    install = install.replace("/tmp/sglang_hotfix_trtllm-%s-py3-none-any.whl" % __version__, str(plugin_wheel))
    # The removal is one line in a fenced block, pasted as it is (issue 37 item 8: the inline
    # command spanned lines, and pasted from the file it broke and still exited 0).
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    removal = [line for line in lines if line.startswith('P="$(which python)"')]
    assert len(removal) == 1
    for command in [install] + removal:
        ran = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=600)
        assert ran.returncode == 0, (command, ran.stderr)
    # Files only: an empty __pycache__ folder uv made is nothing of the plugin's; wrapt stays, as with pip.
    now = {p.relative_to(site) for p in site.rglob("*") if p.is_file()}
    left = {p for p in now - before if not str(p).startswith("wrapt")}
    assert left == set(), sorted(map(str, left))


# --- status --source over odd trees (a review of issue 30's item 4) ---------------------------


def _scan(root, timeout=120):
    return run_cli("status", "--source", str(root), "--json", timeout=timeout)


def test_a_backend_in_a_dot_folder_such_as_a_venv_is_found(tmp_path, installed_backend_source):
    """uv's default environment is `.venv`: 0.6.0 skipped every dot-folder and said there was no backend."""
    sglang_tree(tmp_path / "app" / ".venv" / "lib" / "python3.12" / "site-packages", installed_backend_source)
    ran = _scan(tmp_path / "app")
    assert ran.returncode == 0, ran.stderr
    assert [s["verdict"] for s in ran.record()["sources"]] == ["affected"]


@pytest.mark.parametrize("odd", ["fifo", "broken_link"])
def test_an_odd_file_named_like_the_backend_is_reported_not_read(image_root, odd):
    """A FIFO of that name hung the scan (opened for reading); a broken link read as 'permission denied'."""
    path = image_root / "trtllm_mha_backend.py"
    if odd == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(image_root / "nowhere")
    ran = _scan(image_root, timeout=60)
    assert ran.returncode == 3, ran
    assert sorted(s["verdict"] for s in ran.record()["sources"]) == ["affected", "fixed"]
    reason = {
        "fifo": "a FIFO (named pipe)",
        "broken_link": "a broken link (its target %s does not exist)" % (image_root / "nowhere"),
    }[odd]
    assert ran.report["unreadable"] == ["%s: %s" % (path, reason)] == ran.record()["unreadable"]


def test_a_tree_nested_too_deep_gives_no_traceback(image_root):
    """os.walk recursed past Python's limit (Python 3.11): a traceback and exit 1, read as 'not protected'.
    The walk is iterative now: the deep folder is walked to its end, the other verdicts given."""
    subprocess.run(["mkdir", "-p", "/".join(["d"] * 1100)], cwd=image_root, check=True, timeout=60)
    try:
        ran = _scan(image_root)
    finally:  # pytest's own clean-up (shutil.rmtree) recurses once per level, too deep for it
        subprocess.run(["rm", "-rf", "d"], cwd=image_root, check=True, timeout=60)
    assert "Traceback" not in ran.stderr and ran.returncode == 0, ran
    assert sorted(s["verdict"] for s in ran.record()["sources"]) == ["affected", "fixed"]


def test_the_records_share_one_walk_of_the_tree(image_root):
    """Each record walked the tree again (six walks of an image root; a live one changes between them)."""
    code = (
        "import os, sys\n"
        "calls = []\n"
        "real = os.scandir\n"
        "os.scandir = lambda path='.': (calls.append(os.fspath(path)), real(path))[1]\n"
        "from sglang_hotfix_trtllm.cli import main\n"
        "code = main(['status', '--source', %r, '--json'])\n"
        "sys.stderr.write('WALKS:%%d\\n' %% calls.count(%r))\n"
        "sys.exit(code)\n" % (str(image_root), str(image_root))
    )
    ran = run_python(["-c", code])
    assert ran.returncode == 0 and "WALKS:1\n" in ran.stderr, ran


def test_a_result_cut_short_by_the_file_size_limit_is_said_on_stderr(tmp_path):
    """Python's writer dropped what did not fit (a nearly full disk) without a word: exit 0 and half
    a JSON document. The file size limit stands in for the full disk (Python ignores SIGXFSZ)."""
    import shlex

    from conftest import CLI

    expected = run_cli("status", "--json")
    out = tmp_path / "out.json"
    ran = subprocess.run(
        ["bash", "-c", "ulimit -f 4; %s status --json > %s" % (shlex.quote(str(CLI)), shlex.quote(str(out)))],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )
    assert len(expected.stdout.encode()) > 4096  # the limit cuts it
    assert ran.returncode == expected.returncode and "Traceback" not in ran.stderr, ran.stderr
    assert (
        "cannot write the result to stdout" in ran.stderr
        and "of %d bytes written" % len(expected.stdout.encode()) in ran.stderr
    ), ran.stderr


def test_a_stdout_that_is_not_utf_8_still_gets_the_result(tmp_path):
    """The release ranges hold '…': with an ASCII stdout 0.7.0's first cut wrote nothing at all."""
    expected = run_cli("status")
    ran = run_cli("status", env=clean_env(PYTHONIOENCODING="ascii"))
    assert ran.returncode == expected.returncode and ran.stderr == "", ran.stderr
    assert ran.stdout.splitlines()[0] == expected.stdout.splitlines()[0]
    assert "\\u2026" in ran.stdout or "…" not in expected.stdout


# --- status --source as a pre-deployment check (issue 37, item 4) ------------------------------


def _backend_of(release):
    return release_selection.release_dir(release) / "sglang/srt/layers/attention/trtllm_mha_backend.py"


@pytest.mark.parametrize(
    "release, code, opening",
    [
        ("0.5.12", 0, "PROTECTED: %s has the bugs of records pr26521, pr25103, pr28144, pr31667, encoder_only_mask; "),
        ("0.5.19", 1, "NOT PROTECTED: %s: record xqa_draft_extend would run unpatched"),
        # alone, the FlashInfer that runs with it cannot be told: its kernel bugs, accepted here, are named
        ("0.5.23", 0, "NOTHING TO DO: %s; records flashinfer4161, flashinfer4382: their bugs run unrepaired"),
    ],
)
def test_source_opens_with_one_line_in_status_words_and_its_exit_status_answers_for_the_code(release, code, opening):
    path = str(_backend_of(release))
    text = run_cli("status", "--source", path)
    assert text.returncode == code, text.stderr
    assert text.stdout.splitlines()[0].startswith(opening % path), text.stdout.splitlines()[0]
    ran = _scan(path)
    assert (ran.returncode, ran.report["exit_status"]) == (code, code)
    assert ran.report["headline"] == text.stdout.splitlines()[0]


def test_a_folder_opens_with_one_line_across_its_files_then_one_each(tmp_path):
    for name, release in (("a", "0.5.12"), ("b", "0.5.19")):
        sglang_tree(tmp_path / name, _backend_of(release).read_text(encoding="utf-8"))
    ran = run_cli("status", "--source", str(tmp_path))
    lines = ran.stdout.splitlines()
    assert ran.returncode == 1, ran.stderr
    assert lines[0] == "NOT PROTECTED: 2 backend files: 1 PROTECTED, 1 NOT PROTECTED (one line each below)"
    assert lines[1].startswith("PROTECTED: %s" % (tmp_path / "a"))
    assert lines[2].startswith("NOT PROTECTED: %s" % (tmp_path / "b"))


def test_a_wheel_given_as_the_path_is_not_a_source_file(tmp_path, plugin_wheel):
    """It read as "unknown ... SyntaxError", exit 2 (CANNOT PATCH), as if the code were not recognised."""
    ran = run_cli("status", "--source", str(plugin_wheel))
    assert ran.returncode == 3 and ran.stdout == "", ran
    assert "is not a Python source file" in ran.stderr and "a wheel is a zip archive" in ran.stderr


def test_a_path_with_a_newline_keeps_the_first_line_one_line(tmp_path, installed_backend_source):
    root = sglang_tree(tmp_path / "odd\nname", installed_backend_source)
    ran = run_cli("status", "--source", str(root))
    first = ran.stdout.split("\n", 1)[0]
    assert ran.returncode == 0 and first.startswith("PROTECTED: '") and "\\n" in first, ran.stdout[:300]


# --- issue 48, item 3: what --source says of odd paths, and first lines that say a thing once ---------


@pytest.mark.parametrize("odd, words", [("fifo", "is a FIFO (named pipe)"), ("devnull", "is a character device")])
def test_a_fifo_or_a_device_given_as_the_path_is_named_as_what_it_is(tmp_path, odd, words):
    """Both read "cannot read PATH: Not a directory"."""
    if odd == "fifo":
        path = tmp_path / "trtllm_mha_backend.py"
        os.mkfifo(path)
    else:
        path = pathlib.Path(os.devnull)
    ran = run_cli("status", "--source", str(path), timeout=60)
    assert ran.returncode == 3 and ran.stdout == "", ran
    assert words in ran.stderr and "Not a directory" not in ran.stderr, ran.stderr


def test_a_symlink_loop_is_called_a_loop_as_the_path_and_inside_a_folder(image_root):
    """A loop read "no such file or folder" as the path, and "a broken link" inside a folder."""
    loop = image_root / "loop"
    loop.symlink_to(loop)
    ran = run_cli("status", "--source", str(loop))
    assert ran.returncode == 3 and "symbolic link loop" in ran.stderr and "no such file" not in ran.stderr, ran
    inside = image_root / "etc" / "trtllm_mha_backend.py"
    inside.symlink_to(inside)
    ran = _scan(image_root)
    assert ran.returncode == 3 and ran.report["unreadable"] == [
        "%s: a symbolic link loop (it leads back to itself)" % inside
    ]


def test_a_linked_sglang_folder_the_walk_skips_is_said_with_a_hint(tmp_path, installed_backend_source):
    """A tree whose SGLang is a link to a folder (a mounted checkout) said only "no trtllm_mha_backend.py"."""
    real = sglang_tree(tmp_path / "checkout" / "python", installed_backend_source) / "sglang"
    image = tmp_path / "image" / "app"
    image.mkdir(parents=True)
    (image / "sglang").symlink_to(real)
    ran = run_cli("status", "--source", str(tmp_path / "image"))
    assert ran.returncode == 3, ran
    assert (
        "%s is a link to a folder (%s), not followed: give that folder as --source" % (image / "sglang", real)
        in ran.stderr
    )


def test_an_image_root_says_each_distinct_unknown_message_once(tmp_path):
    """`status --source /` wrote one identical line per record for every file it did not recognise."""
    for name in ("a", "b"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "trtllm_mha_backend.py").write_text("x = 1\n")
    ran = run_cli("status", "--source", str(tmp_path))
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 2 and len(lines) == 2, ran.stderr
    assert all(", ".join(record_names()) + ": " in line for line in lines), lines


def test_a_path_with_a_newline_is_escaped_on_stderr_as_on_stdout(tmp_path):
    root = tmp_path / "odd\nname"
    (root / "x").mkdir(parents=True)
    (root / "x" / "trtllm_mha_backend.py").write_text("x = 1\n")
    ran = run_cli("status", "--source", str(root))
    assert ran.returncode == 2 and ran.stdout.split("\n", 1)[0].startswith("CANNOT PATCH: '"), ran
    assert len(ran.stderr.strip().splitlines()) == 1 and "odd\\nname" in ran.stderr, ran.stderr


def test_a_file_given_by_path_is_not_said_to_be_of_this_environment(tmp_path, installed_backend_source):
    path = tmp_path / "trtllm_mha_backend.py"
    path.write_text(installed_backend_source)
    first = run_cli("status", "--source", str(path)).stdout.splitlines()[0]
    assert "this environment" not in first and "with the plugin installed by pip where this code runs" in first, first


def test_first_lines_name_a_record_once_and_agree_in_number(tmp_path, installed_backend_source):
    """One record's name was said twice ("record pr26521: pr26521: ..."); "record A, B ... runs" and
    "the bugs of record A, B" read as one record."""
    one = run_cli("status", env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE="pr25103")).stdout.splitlines()[0]
    assert "record pr25103 would run unpatched in a new process: SGLANG_HOTFIX_TRTLLM_DISABLE names pr25103" in one, one
    assert "(records pr26521, pr28144, pr31667, encoder_only_mask would be patched)" in one, one
    both = run_cli("status").stdout.splitlines()[0]
    assert both.startswith("PROTECTED: SGLang 0.5.12 has the bugs of records pr26521, pr25103,"), both


def test_without_sglang_no_record_line_says_nothing_to_do(tmp_path, bare_python, target_install):
    """Nine "not-applicable  nothing to do" lines sat under CANNOT PATCH."""
    ran = run_cli("status", python=bare_python, env=clean_env(PYTHONPATH=str(target_install)), cwd=tmp_path)
    assert ran.returncode == 2 and ran.stdout.startswith("CANNOT PATCH: SGLang is not installed for this Python")
    assert "nothing to do" not in ran.stdout, ran.stdout
    assert "this Python has no SGLang: nothing here is patched or protected" in ran.stdout
