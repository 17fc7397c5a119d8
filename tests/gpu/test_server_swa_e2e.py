"""End to end, record pr25103: SGLang 0.5.12's real server with a sliding-window
target (gpt-oss-like, layer 0 slides) and an EAGLE3 draft whose decode runs on
trtllm_mha (XQA on the H200), with the record turned off by name and on.

Skipped as ``test_server_e2e.py`` is (a CUDA device, SGLANG_E2E_SITE and
SGLANG_E2E_PLUGIN_WHEEL), whose launcher, bounds and clean stop it shares:
each server runs on 127.0.0.1 in a process group of its own, at most
START_TIMEOUT to be healthy (or dead), and is always stopped (nothing of the
group left). The plugin is on PYTHONPATH in a ``pip install --target`` folder,
found by SGLang's own plugin loader. docs/gpu.md has the command and results.

Four servers, one per test, in this order:

1. record off (``SGLANG_HOTFIX_TRTLLM_DISABLE=pr25103,pr26521``: every record off by
   name; pr26521 only acts in CUDA-graph capture, which ``--disable-cuda-graph``
   skips), eager, with the test's probe comparing every draft-decode row;
2. the same with both records on;
3. both records on, CUDA graphs: 12 concurrent ``/generate`` requests;
4. pr25103 off by name, pr26521 on (capture needs it), CUDA graphs: the same 12.

The probe is the test's own (``swa_probe/``, put on the servers' PYTHONPATH,
where its ``sitecustomize`` arms a post-import hook; nothing of it is in the
plugin). It compares each row of the XQA kernel's output with fp32 attention
over the draft's own KV at the request's true slots (``req_to_token``) and
length, within a tolerance derived from the row's values
(``swa_probe.bound``), with the query as the kernel reads it: flashinfer's XQA
wrapper reads ``q.data_ptr()`` as contiguous rows, and SGLang hands the
draft's query over as a strided view into its fused QKV projection, so rows 1
and up of a batch attend with other memory than their query (seen on the H200,
both with the record off and on: ``wrong_true_q``; a separate matter from the
KV slots this record is about, reported, not asserted). The workload makes the target's two allocators (full
and sliding-window) hand out different indices: a small pool
(``--max-total-tokens 8192``) and six waves of six concurrent requests of
about 700 tokens, longer than the 128-token window, so that the window's
tokens are evicted and freed slots are reused in different orders.
Everything measured goes to $OUT (one file per server) and stdout.
"""

import concurrent.futures
import json
import os
import pathlib
import random
import re
import sys
import time
import urllib.request

import pytest

torch = pytest.importorskip("torch")
HERE = pathlib.Path(__file__).resolve().parent
PROBE = HERE / "swa_probe"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(PROBE))
import swa_probe  # noqa: E402
from test_server_e2e import BASE_FLAGS, SITE, WHEEL, base_env, free_port, install_target, launch, launch_server, stop  # noqa: E402
from test_server_e2e import wait_until_healthy  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and SITE and WHEEL),
    reason="needs a CUDA device, SGLANG_E2E_SITE and SGLANG_E2E_PLUGIN_WHEEL",
)

FLAGS = [
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
    "--decode-attention-backend",
    "trtllm_mha",
    "--moe-runner-backend",
    "triton",
    "--context-length",
    "4096",
    "--max-total-tokens",
    "8192",
    "--mem-fraction-static",
    "0.3",
    "--decode-log-interval",
    "1",
    "--enable-metrics",
] + BASE_FLAGS
EAGER = ["--disable-cuda-graph"]  # the probe then sees every draft-decode call
GRAPHS = ["--cuda-graph-max-bs", "12"]  # every batch of the 12 requests runs on a captured graph
WAVES, WAVE_SIZE, PROMPT_TOKENS, WAVE_NEW_TOKENS = 6, 6, (680, 720), 64
REQUESTS = 12
RECORDS = ("pr25103", "pr26521")
PATCHED = {
    "pr25103": re.compile(
        r"^.*\bpatched sglang\.srt\.layers\.attention\.trtllm_mha_backend\.TRTLLMHAAttnBackend"
        r"\.__init__ .*$",
        re.M,
    ),
    "pr26521": re.compile(r"^.*\bpatched sglang\.srt\.layers\.attention\.trtllm_mha_backend\..*PR #26521.*$", re.M),
}
GAUGE = re.compile(r"^sglang_hotfix_trtllm_applied\{([^}]*)\}\s+(\S+)$", re.M)
# With --tp 1 the scheduler is the one process that imports the backend.
PROCESSES_IMPORTING_THE_BACKEND = 1
RESULTS = {}


@pytest.fixture(scope="module")
def installs(tmp_path_factory):
    """The plugin in a --target folder, on the servers' PYTHONPATH (as test_server_e2e's case 2)."""
    return install_target(tmp_path_factory.mktemp("installs") / "target")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    import e2e_swa_models

    return e2e_swa_models.build(tmp_path_factory.mktemp("swa-models"))


def post(port, path, payload, timeout=300):
    request = urllib.request.Request(
        "http://127.0.0.1:%d%s" % (port, path),
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def get(port, path, timeout=30):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=timeout) as response:
        return response.read().decode()


def answer(result):
    meta = result.get("meta_info", {})
    return {
        "text": result.get("text"),
        "output_ids": result.get("output_ids"),
        "completion_tokens": meta.get("completion_tokens"),
        "spec_verify_ct": meta.get("spec_verify_ct"),
        "spec_accept_length": meta.get("spec_accept_length"),
    }


def twelve_requests(port):
    """The 12 concurrent greedy requests of test_server_e2e (8 to 52 new tokens)."""

    def one(index):
        return answer(
            post(
                port,
                "/generate",
                {
                    "text": "The quick brown fox %d" % index,
                    "sampling_params": {"max_new_tokens": 8 + 4 * index, "temperature": 0},
                },
            )
        )

    with concurrent.futures.ThreadPoolExecutor(REQUESTS) as pool:
        return list(pool.map(one, range(REQUESTS)))


def waves(port):
    """Six waves of six concurrent greedy requests of 680-720 random tokens, 64 new tokens each."""
    rng = random.Random(25103)
    prompts = [[rng.randrange(3, 512) for _ in range(rng.randint(*PROMPT_TOKENS))] for _ in range(WAVES * WAVE_SIZE)]

    def one(ids):
        return answer(
            post(
                port,
                "/generate",
                {
                    "input_ids": ids,
                    "sampling_params": {"max_new_tokens": WAVE_NEW_TOKENS, "temperature": 0, "ignore_eos": True},
                },
            )
        )

    answers = []
    for wave in range(WAVES):
        with concurrent.futures.ThreadPoolExecutor(WAVE_SIZE) as pool:
            answers += list(pool.map(one, prompts[wave * WAVE_SIZE : (wave + 1) * WAVE_SIZE]))
    return answers


def accept_length(answers):
    tokens = sum(a["completion_tokens"] or 0 for a in answers)
    verifies = sum(a["spec_verify_ct"] or 0 for a in answers)
    return round(tokens / verifies, 4) if verifies else None


def serve(name, tmp_path, models, installs, disable, flags, probe_mode, workloads):
    """Start one server, wait for healthy or death, run the workloads, read /metrics and
    /server_info, always stop it; returns the facts (also written to $OUT)."""
    failed = [n for n, f in RESULTS.items() if f["ready_s"] is None]
    if failed:  # the same model and flags: a second server would only spend its START_TIMEOUT too
        pytest.skip("server %s did not start" % failed[0])
    target, draft = models
    port = free_port()
    probe_dir = tmp_path / ("probe-%s" % name)
    probe_dir.mkdir()
    extra = {
        "PYTHONPATH": os.pathsep.join([str(PROBE), SITE, installs["target"]]),
        "SWA_PROBE": probe_mode,
        "SWA_PROBE_DIR": str(probe_dir),
    }
    if disable:
        extra["SGLANG_HOTFIX_TRTLLM_DISABLE"] = disable
    env = base_env(**extra)
    argv = (
        launch_server()
        + ["--model-path", str(target), "--speculative-draft-model-path", str(draft), "--port", str(port)]
        + FLAGS
        + flags
    )
    log_path = tmp_path / ("server-%s.log" % name)
    started = time.time()
    process = launch(argv, env, log_path, tmp_path)
    facts = {"name": name, "disable": disable, "flags": flags, "ready_s": None, "exit_code": None}
    try:
        wait_until_healthy(process, port, started, facts)
        if facts["ready_s"] is not None:
            for workload in workloads:
                began = time.time()
                try:
                    facts[workload.__name__] = workload(port)
                except Exception as error:
                    facts["%s_error" % workload.__name__] = "%s: %s" % (type(error).__name__, error)
                facts["%s_s" % workload.__name__] = round(time.time() - began, 1)
            try:
                facts["gauge"] = [
                    {"labels": labels, "value": float(value)} for labels, value in GAUGE.findall(get(port, "/metrics"))
                ]
            except Exception as error:
                facts["gauge_error"] = "%s: %s" % (type(error).__name__, error)
            try:
                states = json.loads(get(port, "/server_info")).get("internal_states") or [{}]
                facts["avg_spec_accept_length"] = states[0].get("avg_spec_accept_length")
            except Exception as error:
                facts["server_info_error"] = "%s: %s" % (type(error).__name__, error)
    finally:
        facts["stopped_clean"] = stop(process)
        facts["total_s"] = round(time.time() - started, 1)
    text = log_path.read_text(errors="replace")
    facts["nan_assert"] = "NaN detected!" in text
    facts["capture_failed"] = "Capture cuda graph failed" in text or "Capture CUDA graph failed" in text
    facts["patched_lines"] = {record: len(pattern.findall(text)) for record, pattern in PATCHED.items()}
    facts["patched_line_examples"] = [m for pattern in PATCHED.values() for m in pattern.findall(text)[:1]]
    facts["graph_batch_sizes"] = sorted(
        {int(n) for n in re.findall(r"Decode batch, #running-req: (\d+),.*cuda graph: True", text)}
    )
    log_accept = [float(x) for x in re.findall(r"accept len: ([0-9.]+)", text)]
    facts["log_accept_len"] = {
        "lines": len(log_accept),
        "mean": round(sum(log_accept) / len(log_accept), 4) if log_accept else None,
        "min": min(log_accept, default=None),
        "max": max(log_accept, default=None),
    }
    facts["capture_s"] = [
        float(c) for c in re.findall(r"Capture (?:draft )?cuda graph end\. Time elapsed: ([0-9.]+) s", text)
    ]
    records = []
    for path in sorted(probe_dir.glob("probe-*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    facts["probe"] = swa_probe.summarise(records)
    for key in ("waves", "twelve_requests"):
        if isinstance(facts.get(key), list):
            facts["%s_accept_length" % key] = accept_length(facts[key])
            facts["%s_answered" % key] = sum(1 for a in facts[key] if isinstance(a.get("text"), str))
    shown = {k: v for k, v in facts.items() if k not in ("waves", "twelve_requests")}
    out = os.environ.get("OUT")
    if out:
        answers = {k: facts[k] for k in ("waves", "twelve_requests") if k in facts}
        pathlib.Path(out, "swa-%s.txt" % name).write_text(
            json.dumps(shown, indent=1, default=str)
            + "\n\n----- answers -----\n"
            + json.dumps(answers)
            + "\n\n----- server log, last 40000 characters -----\n"
            + text[-40000:]
        )
    print(json.dumps(shown, indent=1, default=str), flush=True)
    RESULTS[name] = facts
    return facts


def gauge_records(facts):
    """The records of this test (``RECORDS``) with an applied sample on /metrics: the release has other
    records' bugs too (encoder_only_mask, pr28144, pr31667 apply to 0.5.12), which this test leaves on."""
    samples = facts.get("gauge", [])
    names = (re.search(r'record="([^"]*)"', g["labels"]).group(1) for g in samples if g["value"] == 1)
    return sorted(name for name in names if name in RECORDS)


def check_served(facts):
    assert facts["ready_s"] is not None, facts
    assert facts["stopped_clean"], facts
    assert not facts["nan_assert"] and not facts["capture_failed"], facts
    assert not facts["probe"]["probe_errors"], facts["probe"]["probe_errors"]


def test_1_record_off_the_draft_reads_its_own_kv_through_the_targets_swa_mapping(tmp_path, models, installs):
    facts = serve(
        "1-off-eager", tmp_path, models, installs, "pr25103,pr26521", EAGER, "compare", [waves, twelve_requests]
    )
    check_served(facts)
    assert facts["waves_answered"] == WAVES * WAVE_SIZE and facts["twelve_requests_answered"] == REQUESTS, facts
    probe = facts["probe"]
    # What the draft's backend holds: the target's SWAKVPool while its active pool is its own MHATokenToKVPool.
    assert probe["backends"] and all(
        b["use_sliding_window_kv_pool"]
        and b["swa_kv_pool"] == "SWAKVPool"
        and b["active_pool"] == "MHATokenToKVPool"
        and not b["swa_kv_pool_is_active_pool"]
        for b in probe["backends"]
    ), probe["backends"]
    # The workload parted the index spaces, and the kernel was given the translated table.
    assert probe["rows"] > 0 and probe["spaces_parted"] > 0 and probe["table_differs"] > 0, probe
    assert probe["wrong"] > 0, probe
    assert probe["last_slot_mismatch"] == 0, probe
    assert facts["patched_lines"] == {"pr25103": 0, "pr26521": 0}, facts["patched_lines"]
    assert gauge_records(facts) == [], facts.get("gauge")  # no record applied: no sample


def test_2_record_on_every_draft_row_is_attention_over_its_own_kv(tmp_path, models, installs):
    facts = serve("2-on-eager", tmp_path, models, installs, None, EAGER, "compare", [waves, twelve_requests])
    check_served(facts)
    assert facts["waves_answered"] == WAVES * WAVE_SIZE and facts["twelve_requests_answered"] == REQUESTS, facts
    probe = facts["probe"]
    assert probe["backends"] and all(
        not b["use_sliding_window_kv_pool"] and b["swa_kv_pool"] is None and b["active_pool"] == "MHATokenToKVPool"
        for b in probe["backends"]
    ), probe["backends"]
    # The same workload parts the index spaces again; the kernel is given the draft's own table.
    assert probe["rows"] > 0 and probe["spaces_parted"] > 0, probe
    assert probe["table_differs"] == 0 and probe["wrong"] == 0 and probe["nan"] == 0, probe
    assert probe["last_slot_mismatch"] == 0, probe
    assert facts["patched_lines"] == {record: PROCESSES_IMPORTING_THE_BACKEND for record in RECORDS}, facts[
        "patched_lines"
    ]
    assert gauge_records(facts) == sorted(RECORDS), facts.get("gauge")
    off = RESULTS.get("1-off-eager")
    if off and isinstance(off.get("waves"), list):
        # The target verifies every draft token: greedy outputs do not depend on the record.
        assert [a["output_ids"] or a["text"] for a in off["waves"]] == [
            a["output_ids"] or a["text"] for a in facts["waves"]
        ]
        assert [a["text"] for a in off["twelve_requests"]] == [a["text"] for a in facts["twelve_requests"]]


def test_3_cuda_graphs_both_records_on_serve_12_concurrent_requests(tmp_path, models, installs):
    facts = serve("3-on-graphs", tmp_path, models, installs, None, GRAPHS, "attributes", [twelve_requests])
    check_served(facts)
    assert facts["twelve_requests_answered"] == REQUESTS, facts
    assert len(facts["graph_batch_sizes"]) >= 2, facts["graph_batch_sizes"]
    assert facts["probe"]["backends"] and all(
        not b["use_sliding_window_kv_pool"] and b["swa_kv_pool"] is None for b in facts["probe"]["backends"]
    ), facts["probe"]["backends"]
    assert facts["patched_lines"] == {record: PROCESSES_IMPORTING_THE_BACKEND for record in RECORDS}
    assert gauge_records(facts) == sorted(RECORDS), facts.get("gauge")


def test_4_cuda_graphs_record_off_gives_the_same_greedy_outputs(tmp_path, models, installs):
    facts = serve("4-off-graphs", tmp_path, models, installs, "pr25103", GRAPHS, "attributes", [twelve_requests])
    check_served(facts)
    assert facts["twelve_requests_answered"] == REQUESTS, facts
    assert facts["probe"]["backends"] and all(
        b["use_sliding_window_kv_pool"] and b["swa_kv_pool"] == "SWAKVPool" for b in facts["probe"]["backends"]
    ), facts["probe"]["backends"]
    assert facts["patched_lines"] == {"pr25103": 0, "pr26521": PROCESSES_IMPORTING_THE_BACKEND}
    assert gauge_records(facts) == ["pr26521"], facts.get("gauge")
    on = RESULTS.get("3-on-graphs")
    assert on and isinstance(on.get("twelve_requests"), list), "test 3 did not run"
    assert [a["output_ids"] or a["text"] for a in on["twelve_requests"]] == [
        a["output_ids"] or a["text"] for a in facts["twelve_requests"]
    ]
