"""`sglang-hotfix-trtllm verify` on the installed SGLang (CPU)."""

import subprocess
import sys

from conftest import clean_env


def verify(tmp_path, env=None, python=sys.executable):
    return subprocess.run([python, "-m", "sglang_hotfix_trtllm", "verify"], capture_output=True, text=True,
                          env=env or clean_env(), cwd=tmp_path, timeout=600)


def test_verify_shows_unpatched_patched_and_upstream_and_exits_0(tmp_path):
    ran = verify(tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    row = next(l for l in lines if l.strip().startswith("metadata.cache_seqlens_int32"))
    # seq_lens [5, 9, 17], step 1: unpatched zeros; patched and upstream the lengths + 2
    assert row.split()[1:] == ["[0,", "0,", "0]", "[7,", "11,", "19]", "[7,", "11,", "19]"]
    assert "OK: the patched method equals upstream's fix" in ran.stdout


def test_verify_checks_the_patch_even_when_the_hook_is_disabled(tmp_path):
    ran = verify(tmp_path, env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE="1"))
    assert ran.returncode == 0 and "OK:" in ran.stdout


def test_verify_without_torch_says_which_import_failed(tmp_path, bare_python, venv_site_packages):
    # The plugin and SGLang are importable, torch is not (hidden by a stub raising ImportError).
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "torch.py").write_text("raise ImportError('torch is not installed here')\n")
    env = clean_env(PYTHONPATH="%s:%s" % (stub, venv_site_packages))
    ran = verify(tmp_path, env=env, python=bare_python)
    assert ran.returncode == 2
    assert "cannot import torch" in ran.stderr and "cannot import" not in ran.stdout  # errors on stderr only


def test_verify_on_a_fixed_release_has_nothing_to_verify(tmp_path, sglang_release):
    ran = verify(tmp_path, env=clean_env(PYTHONPATH=str(sglang_release("0.5.13"))))
    assert ran.returncode == 0 and "nothing to verify" in ran.stdout
