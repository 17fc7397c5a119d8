"""A second hotfix is one new file: a toy record for a toy module (written here
into a temporary folder) goes through the real machinery -- the import hook,
verdicts from its source, wrapping, `status --json`, remove() -- with no change to any
engine file. The toy record lives in tests/support/toy_record.py."""

import pytest

import toy_record
from conftest import clean_env, record_names


@pytest.fixture
def toy_module(tmp_path):
    def write(method_source):
        package = tmp_path / "toys" / "toy_pkg"
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text("")
        (package / "toy_module.py").write_text(toy_record.module_source(method_source))
        return str(tmp_path / "toys")

    return write


def env_for(folder):
    from conftest import SUPPORT

    return clean_env(PYTHONPATH="%s:%s" % (folder, SUPPORT))


def test_a_toy_record_is_applied_reported_and_removed(scenario, toy_module):
    ran = scenario("toy_record", env=env_for(toy_module(toy_record.BUGGY)))
    assert ran.returncode == 0, ran
    r = ran.result
    assert r["catalog"] == record_names() + ["toy1"] and r["sglang_imported"] is False
    assert r["patched_value"] == 42 and r["wrapper_type"] == "HotfixWrapper" and r["records"] == ["toy1"]
    # status --json: the toy record's entry; the exit status is the worst record's (SGLang 0.5.12
    # in this environment is affected and protected: 0).
    assert r["verdict"] == "affected" and r["would_patch"] is True and r["exit"] == 0
    assert r["restored"] == 1 and r["after_remove"] == 41
    (line,) = [line for line in ran.hotfix_lines() if "INFO: patched" in line]
    assert "patched toy_pkg.toy_module.Counter.next_value" in line and "next_value now counts as toy PR #1 does" in line


def test_a_toy_module_that_has_the_fix_is_left_alone(scenario, toy_module):
    ran = scenario("toy_record", env=env_for(toy_module(toy_record.FIXED)))
    r = ran.result
    assert r["patched_value"] == 42 and r["wrapper_type"] == "function" and r["records"] == []
    assert r["verdict"] == "fixed" and r["exit"] == 0
    assert any("upstream already has the fix" in line for line in ran.hotfix_lines())


@pytest.mark.parametrize("strict", [False, True])
def test_a_recognised_bug_the_record_cannot_repair_is_said_as_such_never_as_not_recognised(
    scenario, toy_module, strict
):
    """Issue 28, item 3: a bug the record recognises but cannot repair exactly has its own verdict:
    the log line and status name it and why (the release that fixes it), exit 1 (NOT PROTECTED),
    never "not recognised" / exit 2; strict mode (for code not recognised) lets the import go on."""
    env = env_for(toy_module(toy_record.UNREPAIRABLE))
    if strict:
        env["SGLANG_HOTFIX_TRTLLM_STRICT"] = "1"
    ran = scenario("toy_record", env=env)
    assert ran.returncode == 0, ran  # the import went on, in strict mode too
    r = ran.result
    assert r["verdict"] == "unrepairable" and r["would_patch"] is False and r["records"] == []
    assert r["patched_value"] == 40 and r["exit"] == 1
    assert r["headline"].startswith("NOT PROTECTED:") and "toy1" in r["headline"]
    # The first line names the record and what fixes it; the whole reason is its block's.
    # one record open: the line names it, then its reason once (0.16.0: "record toy1 ...: toy1: ..." no more)
    opening = "record toy1 would run unpatched in a new process: "
    assert opening + "a bug this hotfix recognises but cannot repair here; toy PR #1 fixes it" in r["headline"]
    assert toy_record.UNREPAIRABLE_REASON in r["reason"] and "not recognised" not in r["headline"]
    (line,) = [line for line in ran.hotfix_lines("toy1") if "toy_pkg" in line]
    assert "WARNING" in line and "recognises but cannot repair exactly here" in line and "toy 2.0" in line
