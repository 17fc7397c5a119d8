"""A running server reports itself through SGLang's Prometheus metrics: each
process that applies a record writes one gauge sample into the multiprocess
folder SGLang's `--enable-metrics` sets, read here with prometheus_client's
real MultiProcessCollector, as SGLang's /metrics reads it."""

from conftest import clean_env, run_python

IMPORT = (
    "import sys, json; import sglang.srt.layers.attention.trtllm_mha_backend;"
    "print('RESULT:' + json.dumps('prometheus_client' in sys.modules))"
)


def scrape(folder):
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(folder))
    return [
        line
        for line in generate_latest(registry).decode().splitlines()
        if line.startswith("sglang_hotfix_trtllm_applied{")
    ]


def test_each_applied_record_is_one_sample_of_the_gauge(tmp_path):
    folder = tmp_path / "prometheus"
    folder.mkdir()
    ran = run_python(["-c", IMPORT], cwd=tmp_path, env=clean_env(PROMETHEUS_MULTIPROC_DIR=str(folder)))
    assert ran.returncode == 0 and ran.result is True, ran
    assert sorted(scrape(folder)) == sorted(
        [
            'sglang_hotfix_trtllm_applied{fingerprint="ast1:c88aa5e773a7e68a",record="pr25103",sglang_version="0.5.12"} 1.0',  # noqa: E501 (verbatim data)
            'sglang_hotfix_trtllm_applied{fingerprint="ast1:e98e6b3d011e7ace",record="pr26521",sglang_version="0.5.12"} 1.0',  # noqa: E501 (verbatim data)
            'sglang_hotfix_trtllm_applied{fingerprint="ast1:0a81c60473bbd26c",record="pr28144",sglang_version="0.5.12"} 1.0',  # noqa: E501 (verbatim data)
            'sglang_hotfix_trtllm_applied{fingerprint="ast1:cc7da69ada8dbf71",record="pr31667",sglang_version="0.5.12"} 1.0',  # noqa: E501 (verbatim data)
            'sglang_hotfix_trtllm_applied{fingerprint="ast1:52036f0a3a55c1e1",record="encoder_only_mask",sglang_version="0.5.12"} 1.0',  # noqa: E501 (verbatim data)
        ]
    )


def test_after_remove_every_sample_of_the_process_reads_0(tmp_path):
    """Issue 48, item 3: /metrics kept 1.0 for every record after remove()."""
    folder = tmp_path / "prometheus"
    folder.mkdir()
    code = IMPORT.replace("print(", "__import__('sglang_hotfix_trtllm').remove(); print(")
    ran = run_python(["-c", code], cwd=tmp_path, env=clean_env(PROMETHEUS_MULTIPROC_DIR=str(folder)))
    assert ran.returncode == 0 and ran.result is True, ran
    samples = scrape(folder)
    assert len(samples) == 5 and all(sample.endswith("} 0.0") for sample in samples), samples


def test_records_turned_off_write_no_sample_and_import_nothing(tmp_path):
    folder = tmp_path / "prometheus"
    folder.mkdir()
    ran = run_python(
        ["-c", IMPORT],
        cwd=tmp_path,
        env=clean_env(PROMETHEUS_MULTIPROC_DIR=str(folder), SGLANG_HOTFIX_TRTLLM_DISABLE="1"),
    )
    assert ran.returncode == 0 and ran.result is False, ran
    assert list(folder.iterdir()) == []


def test_with_metrics_off_nothing_is_imported_or_written(tmp_path):
    """No PROMETHEUS_MULTIPROC_DIR: the engine's report is a no-op (a record applied, here the
    call the engine makes after patching, without SGLang)."""
    code = (
        "import sys, json; from sglang_hotfix_trtllm import metrics; from sglang_hotfix_trtllm.records import pr26521;"
        "written = metrics.report_applied(pr26521.HOTFIX, '0.5.12', 'ast1:x');"
        "print('RESULT:' + json.dumps([written, 'prometheus_client' in sys.modules]))"
    )
    ran = run_python(["-c", code], cwd=tmp_path, env=clean_env())
    assert ran.returncode == 0 and ran.result == [False, False], ran


def test_a_multiprocess_folder_that_is_not_there_is_said(tmp_path, monkeypatch, caplog):
    """Issue 37, item 13: a PROMETHEUS_MULTIPROC_DIR that does not exist gave no sample and no word."""
    import logging

    from sglang_hotfix_trtllm import logs, metrics
    from sglang_hotfix_trtllm.records import catalog

    monkeypatch.setenv(metrics.MULTIPROC_DIR, str(tmp_path / "missing"))
    monkeypatch.setattr(logs, "_said", set())
    with caplog.at_level(logging.WARNING, logger="sglang_hotfix_trtllm"):
        assert metrics.report_applied(catalog.HOTFIXES[0], "0.5.12", "ast1:0") is False
    (line,) = [r.getMessage() for r in caplog.records]
    assert "is not a folder" in line and str(tmp_path / "missing") in line
