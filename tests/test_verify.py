"""`sglang-hotfix-trtllm verify` on the installed SGLang (CPU)."""

import json
import re
import sys

import pytest

import release_selection

from conftest import clean_env, record_names, run_cli, run_python, sglang_tree


def verify(tmp_path, env=None, python=sys.executable):
    return run_cli("verify", python=python, env=env, cwd=tmp_path, timeout=600)


def test_verify_shows_unpatched_patched_and_upstream(tmp_path):
    ran = verify(tmp_path)
    assert ran.returncode == 3, ran.stdout + ran.stderr  # 0.5.12: records without a CPU probe are left unverified
    lines = ran.stdout.splitlines()
    row = next(line for line in lines if line.strip().startswith("metadata.cache_seqlens_int32"))
    # seq_lens [5, 9, 17], step 1: unpatched zeros; patched and upstream the lengths + 2
    assert row.split()[1:] == ["[0,", "0,", "0]", "[7,", "11,", "19]", "[7,", "11,", "19]"]
    assert "OK: the patched method equals upstream's fix" in ran.stdout


@pytest.mark.parametrize(
    "value, off", [("1", ["pr26521", "pr25103", "pr28144", "pr31667", "encoder_only_mask"]), ("pr25103", ["pr25103"])]
)
def test_verify_reports_a_record_turned_off_as_not_verified_and_exits_1(tmp_path, value, off):
    ran = verify(tmp_path, env=clean_env(SGLANG_HOTFIX_TRTLLM_DISABLE=value))
    assert ran.returncode == 1, ran.stdout + ran.stderr
    lines = [line for line in ran.stdout.splitlines() if line.startswith("NOT VERIFIED: record")]
    assert [line.split()[3] for line in lines] == off
    probed = [name for name in ("pr26521", "pr25103") if name not in off]  # the kernel-call records: no CPU probe
    assert ran.stdout.count("OK: the patched method equals upstream's fix") == len(probed)


def test_verify_says_which_record_it_cannot_verify_on_cpu_and_exits_3_for_it(tmp_path):
    """Issue 48, item 3: it exited 0 with 3 of 5 affected records unverified, and ended with no
    summary; encoder_only_mask's line cited "the GPU run", which did not exist as it said."""
    ran = verify(tmp_path)
    assert ran.returncode == 3, ran.stdout + ran.stderr
    assert "not verified here: record pr28144 has no CPU probe" in ran.stdout
    last = ran.stdout.splitlines()[-1]
    assert last == (
        "summary (exit 3): not verified here (no CPU probe): pr28144, pr31667, encoder_only_mask; verified: patched "
        "equals upstream: pr26521, pr25103; nothing to verify: pr17732, pr19107, xqa_workspace, xqa_draft_extend, "
        "flashinfer4161, flashinfer4382"
    ), last
    line = next(
        line for line in ran.stdout.splitlines() if line.startswith("not verified here: record encoder_only_mask")
    )
    assert "the GPU run" not in line and "on an H100 with 0.14.0, SGLang 0.5.19's ENCODER_ONLY prefill" in line, line
    assert "not on Blackwell" in line


def test_verify_json_is_one_document_with_each_records_outcome(tmp_path):
    ran = run_cli("verify", "--json", cwd=tmp_path, timeout=600)
    document = json.loads(ran.stdout)
    assert ran.returncode == document["exit_status"] == 3, ran.stderr
    outcomes = {r["hotfix"]: r["outcome"] for r in document["records"]}
    assert outcomes == {
        "pr26521": "verified",
        "pr25103": "verified",
        "pr28144": "not-verified",
        "pr31667": "not-verified",
        "pr17732": "nothing-to-verify",
        "pr19107": "nothing-to-verify",
        "xqa_workspace": "nothing-to-verify",
        "encoder_only_mask": "not-verified",
        "xqa_draft_extend": "nothing-to-verify",
        "flashinfer4161": "nothing-to-verify",
        "flashinfer4382": "nothing-to-verify",
    }
    pr26521 = document["records"][0]
    assert pr26521["rows"] and pr26521["exit_status"] == 0 and pr26521["message"].startswith("OK: ")
    assert document["summary"].startswith("summary (exit 3): ")


def test_verify_without_torch_says_which_import_failed(tmp_path, bare_python, venv_site_packages):
    # The plugin and SGLang are importable, torch is not (hidden by a stub raising ImportError).
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "torch.py").write_text("raise ImportError('torch is not installed here')\n")
    env = clean_env(PYTHONPATH="%s:%s" % (stub, venv_site_packages))
    ran = verify(tmp_path, env=env, python=bare_python)
    assert ran.returncode == 2
    assert "cannot import" not in ran.stdout  # errors on stderr only
    # Issue 30, item 5: the failure was said once per record, word for word, naming none of them.
    assert ran.stderr.count("cannot import torch: ImportError: torch is not installed here") == 1, ran.stderr
    assert "record pr26521: cannot verify: cannot import torch" in ran.stderr
    assert "it needs torch and SGLang's own dependencies" in ran.stderr
    assert "record pr25103: cannot verify: torch could not be imported (said above)" in ran.stderr


def test_every_verify_block_names_its_record(tmp_path):
    """Issue 30, item 5: a block opened with the method alone; two records share forward_decode."""
    from sglang_hotfix_trtllm.records import catalog

    ran = verify(tmp_path)
    openings = [line.split(":")[0] for line in ran.stdout.splitlines() if line.startswith("record ")]
    assert openings == ["record " + h.name for h in catalog.HOTFIXES], ran.stdout


def test_verify_on_a_fixed_release_has_nothing_to_verify(tmp_path):
    ran = verify(tmp_path, env=clean_env(PYTHONPATH=str(release_selection.installed("0.5.13"))))
    # 0.5.13 fixes pr26521 and pr25103; pr28144, pr31667 and encoder_only_mask still have a bug there,
    # which no CPU probe shows repaired (exit 3)
    assert ran.returncode == 3 and "nothing to verify" in ran.stdout, ran.stdout + ran.stderr
    assert ran.stdout.splitlines()[-1].endswith(
        "nothing to verify: pr26521, pr25103, pr17732, pr19107, xqa_workspace, xqa_draft_extend, flashinfer4161, "
        "flashinfer4382"
    )


def test_verify_where_every_record_is_fixed_exits_0(tmp_path, installed_backend_path):
    fixed = (
        release_selection.release_dir("0.5.23") / "sglang" / "srt" / "layers" / "attention" / "trtllm_mha_backend.py"
    )
    root = sglang_tree(
        tmp_path / "fixed", fixed.read_text(encoding="utf-8"), link_installed=installed_backend_path.parents[3]
    )
    ran = verify(tmp_path, env=clean_env(PYTHONPATH=str(root)))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.splitlines()[-1] == "summary (exit 0): nothing to verify: " + ", ".join(record_names())


def _table(stdout, target):
    """The rows verify prints for the record of ``target``: field -> (unpatched, patched, upstream fix),
    split at the header's column positions (cells may hold spaces)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("record ") and (" %s:" % target) in line)
    header_at = next(i for i in range(start, len(lines)) if lines[i].startswith("  field "))
    header = lines[header_at]
    starts = [m.start() for m in re.finditer(r"(?<=  )\S", header)] + [None]  # columns are two spaces apart
    assert len(starts) == 5, header
    rows = {}
    for line in lines[header_at + 1 :]:
        if not line.startswith("  "):
            break
        cells = [line[a:b].strip() for a, b in zip(starts, starts[1:])]
        rows[cells[0]] = tuple(cells[1:])
    return rows


def test_verify_runs_pr25103s_probe_on_real_pools_and_exits_0(tmp_path):
    from sglang_hotfix_trtllm.records import pr25103

    ran = verify(tmp_path)
    assert ran.returncode == 3, ran.stdout + ran.stderr
    assert ran.stdout.count("OK: the patched method equals upstream's fix") == 2  # both records verified
    rows = _table(ran.stdout, pr25103.HOTFIX.target)
    # The bug: SGLang's own __init__ gives the EAGLE3 draft the target's SWAKVPool; 0.5.13 and the hotfix give None.
    assert rows == {
        "target: _swa_kv_pool": ("SWAKVPool (own pool)",) * 3,
        "target: use_sliding_window_kv_pool": ("True",) * 3,
        "EAGLE3 draft: _swa_kv_pool": ("SWAKVPool (target's pool)", "None", "None"),
        "EAGLE3 draft: use_sliding_window_kv_pool": ("True", "False", "False"),
    }


PROBE_WITH_A_NO_OP_WRAPPER = """
import json
import sglang.srt.layers.attention.trtllm_mha_backend as backend
from sglang_hotfix_trtllm import verify
from sglang_hotfix_trtllm.records import pr25103, pr25103_probe
from sglang_hotfix_trtllm.record import Hotfix

cls = backend.TRTLLMHAAttnBackend
init, module_globals = cls.__dict__["__init__"], dict(vars(backend))
real = pr25103_probe.probe(backend)

def no_op(module, wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)

fields = {name: getattr(pr25103.HOTFIX, name) for name in Hotfix.__slots__}
fields["wrapper"] = no_op
pr25103.HOTFIX = Hotfix(**fields)  # what the probe wraps SGLang's __init__ with
broken = pr25103_probe.probe(backend)
printed = []
code = verify.verify(pr25103.HOTFIX, printed.append, printed.append)
print("RESULT:" + json.dumps({
    "real": real.patched_equals_upstream, "broken": broken.patched_equals_upstream, "rows": broken.rows,
    "detail": broken.detail, "exit": code, "last": printed[-1],
    "class_untouched": cls.__dict__["__init__"] is init,
    "globals_untouched": vars(backend).keys() == module_globals.keys()
                         and all(vars(backend)[k] is v for k, v in module_globals.items()),
}))
"""


def test_pr25103s_probe_fails_when_the_wrapper_does_not_repair(tmp_path):
    # The same probe, in a process of its own, with the record's wrapper replaced by one that only calls SGLang's.
    ran = run_python(["-c", PROBE_WITH_A_NO_OP_WRAPPER], cwd=tmp_path)
    assert ran.returncode == 0, ran
    result = ran.result
    assert result["real"] is True and result["broken"] is False
    rows = {row[0]: tuple(row[1:]) for row in result["rows"]}
    assert rows["EAGLE3 draft: _swa_kv_pool"] == ("SWAKVPool (target's pool)", "SWAKVPool (target's pool)", "None")
    assert rows["EAGLE3 draft: use_sliding_window_kv_pool"] == ("True", "True", "False")
    assert "EAGLE3 draft" in result["detail"] and "target" not in result["detail"].split(":", 1)[1]
    assert result["exit"] == 1 and result["last"].startswith("MISMATCH")
    # The probe changed neither SGLang's class nor its module's globals (its workspace buffer included).
    assert result["class_untouched"] and result["globals_untouched"]
