"""Issue 38, item 1, the server part: what an operator pays, three real SGLang 0.5.12 servers side
by side on one GPU, load rounds interleaved.

    python server_ab_worker.py --plugin-target DIR --anchor FILE [--eager] [--orders release,hotfix,anchor ...]

Arms, one server each (``python -m sglang.launch_server``, test_server_e2e's launcher and clean stop):

* ``release``: SGLang as shipped (the plugin not on the path at all);
* ``hotfix``: the plugin on the server's PYTHONPATH (a ``pip install --target`` folder: SGLang's own
  plugin loader applies it, as in test_server_e2e's case 2);
* ``anchor``: SGLang with ``tools/anchor_source.py``'s file (0.5.12 with upstream's changes for the
  records that apply there inserted: PR #26521, PR #25103 as in 0.5.13, PR #28144 as in 0.5.15,
  PR #31667 as in 0.5.16, encoder_only_mask as in 0.5.22) in place of its ``trtllm_mha_backend.py``,
  in a copy of the ``sglang`` package put first on the path (what an upgrade would cost); the
  plugin not on the path;
* ``disabled``: the plugin on the path as in ``hotfix``, turned off with
  ``SGLANG_HOTFIX_TRTLLM_DISABLE=1`` (what the plugin's mere presence costs);
* ``anchor2``: a second server exactly as ``anchor`` (the A/A floor: what two servers of the same
  code differ by on this host).

The model is Llama-3-8B's shape (32 layers, hidden 4096, 32 query and 8 KV heads of 128, vocabulary
128256) with SGLang's dummy weights (``--load-format dummy``: nothing to download or build) and no
tokenizer (``--skip-tokenizer-init``: requests and answers are token ids). Decode on trtllm_mha
(XQA on the H200), prefill on triton (0.5.12 refuses trtllm_mha prefill below SM100), BF16 KV
cache, radix cache off. A load round: 64 requests at once, each 512 random prompt tokens (one
fixed set for every round and arm) and 128 new tokens (``ignore_eos``, greedy); its time is from the
first request sent to the last answer. CUDA graphs on (``--cuda-graph-max-bs 64``: every decode
batch of the round on a captured graph) or off (``--eager``: ``--disable-cuda-graph``). Prefill's
piecewise CUDA graphs are off in every arm (prefill is triton's, not what is compared).

CPUs: each server runs on a CPU set of its own (by its place in the start order), this process on
the rest (``cpu_sets``); ``--spare-cpu0`` keeps CPU 0 (and its interrupts) out of every server's set
and gives it to this process. ``--swap-cpu-sets``: after each cycle the servers' CPU sets turn one
place (every thread of every process of each server's group moved), so that each arm runs the same
number of rounds in each set; the places of each cycle are kept (``places``). Without it, the eager
A/B of 2026-12-06 showed the server on the second set faster in both start orders, by 2.6 and 8.3%.
Besides the round times, each server's own decode figures are kept
(``decode_tokens_per_s``: its log's tokens/s at the full batch, intervals that hold decode steps
only), and compared per pair of arms (``decode_summary``: medians and a bootstrap 95% interval of
their difference).

Memory: each server is capped at 65,536 KV tokens (``--max-total-tokens``: a pool of 8 GB) with
``--mem-fraction-static 0.5``; launched together, each sees the same free memory, so the cap is
what leaves the others room. Three servers of 16 GB of weights do not fit an 80 GB H100 so:
``--max-total-tokens 49152 --mem-fraction-static 0.9`` there (a round needs 64 x 640 = 40,960
tokens; each server's log line with ``max_total_num_tokens`` is kept in the JSON).

For each start order given, the servers are launched together (an order names which CPU set each
arm gets), take one untimed round each, then cycles: one round per arm, the six orders of the three
arms in turn, until the order's share of ``--budget-s`` is spent; then all stop. Reported per pair
of arms: the median over cycles of the percentage difference of round times, with a
distribution-free 95% interval, pooled over the start orders and per order; the token counts, and
whether the hotfix's and the anchor's greedy answers are equal. Writes ``$OUT/server_ab_<mode>.json``
after every cycle, and each server's log (its last 60,000 characters) as
``$OUT/server_ab_<mode>_<order>_<arm>.log``.
"""

import argparse
import concurrent.futures
import itertools
import json
import os
import pathlib
import random
import re
import shutil
import signal
import statistics
import sys
import time
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from test_server_e2e import BASE_FLAGS, base_env, free_port, launch, launch_server, stop, wait_until_healthy  # noqa: E402

ARMS = ("release", "hotfix", "anchor", "disabled")
BACKEND_FILE = "sglang/srt/layers/attention/trtllm_mha_backend.py"
BATCH, PROMPT, NEW = 64, 512, 128
LLAMA_3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
FLAGS = [
    "--load-format",
    "dummy",
    "--skip-tokenizer-init",
    "--decode-attention-backend",
    "trtllm_mha",
    "--disable-radix-cache",
    "--mem-fraction-static",
    "0.5",
    "--max-total-tokens",
    "65536",
    "--max-running-requests",
    str(BATCH),
    # Prefill runs on triton in every arm, outside what is compared; its piecewise CUDA-graph
    # capture took 82 s of each server's start (about 150 s) and left the arms a few cycles.
    "--disable-piecewise-cuda-graph",
    # A decode line every 10 steps (SGLang's default is 40): about 11 intervals of decode alone per
    # round for ``decode_tokens_per_s`` instead of about 2 (issue 47's run).
    "--decode-log-interval",
    "10",
] + BASE_FLAGS


def model_folder(root):
    folder = pathlib.Path(root) / "llama3-8b-shape"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(LLAMA_3_8B, indent=2))
    return folder


def anchor_site(root, site, anchor):
    """A copy of the site's ``sglang`` package with the anchor file as its backend module."""
    copy = pathlib.Path(root) / "anchor-site"
    if not (copy / BACKEND_FILE).exists():
        shutil.copytree(pathlib.Path(site) / "sglang", copy / "sglang")
    shutil.copyfile(anchor, copy / BACKEND_FILE)
    return copy


def prompts():
    generator = random.Random(0)
    return [[generator.randrange(1000, 100000) for _ in range(PROMPT)] for _ in range(BATCH)]


def arm_environment(arm, site, plugin_target, anchor_copy):
    paths = {
        "release": [site],
        "hotfix": [site, plugin_target],
        "anchor": [str(anchor_copy), site],
        "anchor2": [str(anchor_copy), site],  # a second anchor server: the A/A floor of the same code
        "disabled": [site, plugin_target],
    }[arm]
    extra = {"SGLANG_HOTFIX_TRTLLM_DISABLE": "1"} if arm == "disabled" else {}
    return base_env(PYTHONPATH=os.pathsep.join(str(p) for p in paths), **extra)


def host_cpus():
    """The CPUs this process may use when it starts (before any order narrows them); None where
    this host cannot tell."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def cpu_plan(orders, spare=(), share=None):
    """Each start order's CPU sets (``cpu_sets``), all cut before the first order narrows this
    process's own CPUs to its client set: read again later, the affinity would be that set."""
    cpus = host_cpus()
    return {order: cpu_sets(order.split(","), cpus, spare, share) for order in orders}


def cpu_sets(arms, cpus, spare=(), share=None):
    """Disjoint CPU sets of ``cpus`` (``host_cpus``: every order's sets are cut from all of them,
    not from the client's set of the order before), one per arm in the order given (the servers'
    start order: each arm gets the first set in one order and another in the other, so a slower
    set, the one holding CPU 0 and its interrupts, is not one arm's), and one for this process (the
    load client): an idle SGLang scheduler polls on a core, and two servers left to the OS share
    cores with each other's busy threads. CPUs in ``spare`` (CPU 0 with ``--spare-cpu0``) go to no
    server: the servers' sets are cut, of the same size, from the others, and the client gets the
    rest. ``share`` sets each server's number of CPUs (``--server-cpus``: three servers at five
    CPUs each, as two get by default, where eager decode is CPU-bound); by default the client gets
    as many as a server. None where this host cannot tell, or where the sets would not fit."""
    if not cpus:
        return None
    share = share or len(cpus) // (len(arms) + 1)
    if share < 2 or share * len(arms) > len([cpu for cpu in cpus if cpu not in set(spare)]):
        return None
    servers = [cpu for cpu in cpus if cpu not in set(spare)]
    sets = {arm: set(servers[i * share : (i + 1) * share]) for i, arm in enumerate(arms)}
    sets[None] = set(cpus) - set().union(*sets.values())
    return sets


def group_threads(pgid):
    """Every thread of every process in process group ``pgid`` (a server and what it started)."""
    threads = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as stat:
                fields = stat.read().rpartition(")")[2].split()
            if int(fields[2]) != pgid:  # after the command's name: state, ppid, pgrp
                continue
            threads += [int(tid) for tid in os.listdir("/proc/%s/task" % entry)]
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return threads


def move_server(server, cpus):
    """Every thread of ``server``'s process group onto ``cpus``; the number moved."""
    moved = 0
    for tid in group_threads(server["process"].pid):
        try:
            os.sched_setaffinity(tid, cpus)
            moved += 1
        except OSError:
            continue  # a thread that ended meanwhile
    return moved


def turn_places(servers, sets, places):
    """Each arm's CPU set one place on (arm i takes the set of arm i+1 in ``places``' order)."""
    arms = list(places)
    turned = {arm: places[arms[(i + 1) % len(arms)]] for i, arm in enumerate(arms)}
    for arm, place in turned.items():
        move_server(servers[arm], sets[place])
    return turned


def begin(arm, model, eager, environment, workdir, label, cpus=None):
    """One server launched (not yet healthy), its processes on ``cpus``."""
    port = free_port()
    argv = launch_server() + ["--model-path", str(model), "--port", str(port)] + FLAGS
    argv += ["--disable-cuda-graph"] if eager else ["--cuda-graph-max-bs", str(BATCH)]
    log_path = pathlib.Path(workdir) / ("%s.log" % label)
    began = time.time()
    kept = os.sched_getaffinity(0) if cpus else None
    if cpus:
        os.sched_setaffinity(0, cpus)  # the server's processes inherit it
    try:
        process = launch(argv, environment, log_path, workdir)
    finally:
        if kept:
            os.sched_setaffinity(0, kept)
    return {"arm": arm, "port": port, "process": process, "log": log_path, "began": began}


def ready(server):
    """``server`` once healthy, with its ``ready_s``; stopped, and RuntimeError, where it died or hung."""
    facts = {}
    wait_until_healthy(server["process"], server["port"], server["began"], facts)
    if "ready_s" in facts:
        return dict(server, ready_s=facts["ready_s"])
    stop(server["process"])
    tail = server["log"].read_text()[-4000:]
    raise RuntimeError("%s did not become healthy (%s):\n%s" % (server["log"].stem, facts, tail))


def generate(port, ids):
    body = json.dumps(
        {"input_ids": ids, "sampling_params": {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}}
    ).encode()
    request = urllib.request.Request(
        "http://127.0.0.1:%d/generate" % port, data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def load_round(port, batch, pool):
    began = time.perf_counter()
    answers = list(pool.map(lambda ids: generate(port, ids), batch))
    seconds = time.perf_counter() - began
    outputs = [answer.get("output_ids") or [] for answer in answers]
    return seconds, outputs


DECODE_LINE = re.compile(r"Decode batch, #running-req: (\d+), #token: (\d+),.*gen throughput \(token/s\): ([0-9.]+)")
BATCH_LINE = re.compile(r"(Prefill|Decode) batch[,.]")


def decode_throughputs(text):
    """The server's own decode figures (a line every 10 decode steps, ``--decode-log-interval``):
    tokens/s of the intervals at the full batch that hold decode steps only. A line's interval runs
    from the decode line before it, so a line counts when the batch line (prefill or decode) right
    before it is a decode line at the full batch: the first decode line after a round's prefill
    holds that prefill and the idle time since the round before. (Until issue 47's run, the test
    was "the cache's ``#token`` grew since the line before": SGLang rounds ``#token`` to coarse
    steps, so that test let some first lines of a round in, with their prefill, and left out some
    intervals inside a round.)"""
    values, previous_full = [], False
    for line in text.splitlines():
        if not BATCH_LINE.search(line):
            continue
        match = DECODE_LINE.search(line)
        full = bool(match) and int(match.group(1)) == BATCH
        if full and previous_full:
            values.append(float(match.group(3)))
        previous_full = full
    return values


def median_difference(a, b, resamples=2000, seed=0):
    """Percent difference of the medians of ``a`` and ``b`` (a against b), with a bootstrap 95%
    interval (each list resampled on its own)."""
    if not a or not b:
        return None
    generator = random.Random(seed)
    point = 100.0 * (statistics.median(a) - statistics.median(b)) / statistics.median(b)
    draws = sorted(
        100.0
        * (
            statistics.median(generator.choices(a, k=len(a)))
            - (mb := statistics.median(generator.choices(b, k=len(b))))
        )
        / mb
        for _ in range(resamples)
    )
    return {
        "median_percent": round(point, 2),
        "percent_95ci": [round(draws[int(0.025 * resamples)], 2), round(draws[int(0.975 * resamples) - 1], 2)],
        "n": [len(a), len(b)],
    }


def decode_summary(orders):
    """Per start order and pooled: each arm's median decode tokens/s, and each pair's difference."""
    per_order, pooled = {}, {}
    for order, facts in orders.items():
        lists = facts.get("decode_tokens_per_s") or {}
        for arm, values in lists.items():
            pooled.setdefault(arm, []).extend(values)
        per_order[order] = _decode_pairs(lists)
    return {"per_order": per_order, "pooled": _decode_pairs(pooled)}


def _decode_pairs(lists):
    present = {arm for arm, values in lists.items() if values}
    out = {"median": {arm: round(statistics.median(lists[arm]), 2) for arm in sorted(present)}}
    for pair in PAIRS:
        if set(pair) <= present:
            out["%s_vs_%s" % pair] = median_difference(lists[pair[0]], lists[pair[1]])
    return out


def compared(cycles, a, b):
    differences = [100.0 * (cycle[a] - cycle[b]) / cycle[b] for cycle in cycles]
    if not differences:
        return None
    ordered, n = sorted(differences), len(differences)
    half = 0.98 * n**0.5  # distribution-free interval of the median (as decode_step_ab_worker's)
    low, high = max(0, int(n / 2 - half)), min(n - 1, int(n / 2 + half))
    return {
        "median_percent": round(statistics.median(differences), 2),
        "percent_95ci": [round(ordered[low], 2), round(ordered[high], 2)],
        "mean_percent": round(statistics.mean(differences), 2),
        "cycles": n,
    }


PAIRS = (
    ("hotfix", "release"),
    ("hotfix", "anchor"),
    ("anchor", "release"),
    ("hotfix", "disabled"),
    ("disabled", "anchor"),
    ("disabled", "release"),
    ("anchor2", "anchor"),
    ("hotfix", "anchor2"),
)


def summary(by_order):
    every = [cycle for cycles in by_order.values() for cycle in cycles]
    present = set(every[0]) if every else set()
    pairs = [p for p in PAIRS if set(p) <= present]
    out = {"%s_vs_%s" % pair: compared(every, *pair) for pair in pairs}
    out["round_median_s"] = {arm: round(statistics.median(c[arm] for c in every), 3) for arm in sorted(present)}
    out["per_order"] = {
        order: {"%s_vs_%s" % pair: compared(cycles, *pair) for pair in pairs} for order, cycles in by_order.items()
    }
    return out


def _stop_on_sigterm(signum, frame):
    # A command's time limit sends SIGTERM: leave through the finally blocks, which stop every
    # server's process group (each runs in a session of its own and would outlive this process).
    raise SystemExit("SIGTERM: stopping the servers")


def main():
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    parser = argparse.ArgumentParser()
    parser.add_argument("--site", default=os.environ.get("SGLANG_E2E_SITE", "/tmp/site"))
    parser.add_argument("--plugin-target", required=True)
    parser.add_argument("--anchor", required=True)
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--orders", nargs="+", default=["release,hotfix,anchor", "anchor,hotfix,release"])
    parser.add_argument("--arms", default=",".join(ARMS), help="the arms to run, comma-separated (their start order)")
    parser.add_argument("--budget-s", type=float, default=520.0)
    parser.add_argument("--workdir", default="/tmp/server-ab")
    parser.add_argument("--max-total-tokens", type=int, default=65536, help="each server's KV cap")
    parser.add_argument("--mem-fraction-static", default="0.5")
    parser.add_argument("--spare-cpu0", action="store_true", help="keep CPU 0 out of every server's CPU set")
    parser.add_argument("--server-cpus", type=int, help="each server's number of CPUs (default: a fair share)")
    parser.add_argument(
        "--swap-cpu-sets", action="store_true", help="turn the servers' CPU sets one place after each cycle"
    )
    options = parser.parse_args()
    FLAGS[FLAGS.index("--max-total-tokens") + 1] = str(options.max_total_tokens)
    FLAGS[FLAGS.index("--mem-fraction-static") + 1] = str(options.mem_fraction_static)
    began = time.time()
    out = pathlib.Path(os.environ.get("OUT", options.workdir))
    mode = "eager" if options.eager else "graphs"
    workdir = pathlib.Path(options.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model = model_folder(workdir)
    anchor_copy = anchor_site(workdir, options.site, options.anchor)
    batch = prompts()
    result = {"mode": mode, "batch": BATCH, "prompt_tokens": PROMPT, "new_tokens": NEW, "orders": {}, "cycles": {}}
    by_order = {}
    arms = tuple(options.arms.split(","))
    orders = [order for order in options.orders if set(order.split(",")) == set(arms)] or [options.arms]
    permutations = list(itertools.permutations(arms))
    plan = cpu_plan(orders, spare=(0,) if options.spare_cpu0 else (), share=options.server_cpus)
    with concurrent.futures.ThreadPoolExecutor(BATCH) as pool:
        for index, order_text in enumerate(orders):
            order = order_text.split(",")
            share = (options.budget_s - (time.time() - began)) / (len(orders) - index)
            order_began, servers = time.time(), {}
            facts = result["orders"][order_text] = {"ready_s": {}}
            sets = plan[order_text]
            if sets:
                os.sched_setaffinity(0, sets[None])
                facts["cpu_sets"] = {str(arm): sorted(cpus) for arm, cpus in sets.items()}
            try:
                for arm in order:  # launched together, each on its own CPU set: one start's wait, not three
                    label = "server_ab_%s_%s_%s" % (mode, "-".join(order), arm)
                    environment = arm_environment(arm, options.site, options.plugin_target, anchor_copy)
                    servers[arm] = begin(arm, model, options.eager, environment, workdir, label, sets and sets[arm])
                for arm in order:
                    servers[arm] = ready(servers[arm])
                    facts["ready_s"][arm] = servers[arm]["ready_s"]
                first = {}
                for arm in order:  # one untimed round each: JIT, allocator, first graphs
                    _, first[arm] = load_round(servers[arm]["port"], batch, pool)
                facts["new_tokens_per_answer"] = {arm: sorted({len(o) for o in first[arm]}) for arm in order}
                for a, b in itertools.combinations(order, 2):
                    facts["answers_equal_%s_%s" % (a, b)] = sum(x == y for x, y in zip(first[a], first[b]))
                cycles = by_order[order_text] = []
                places = {arm: arm for arm in order}  # arm -> the arm whose CPU set it has now
                facts["places"] = []
                cycle_s = None
                while True:
                    spent = time.time() - order_began
                    if cycle_s is not None and spent + cycle_s + 45 > share:
                        break
                    cycle_began, times = time.time(), {}
                    for arm in permutations[len(cycles) % len(permutations)]:
                        times[arm], _ = load_round(servers[arm]["port"], batch, pool)
                    cycles.append(times)
                    facts["places"].append(dict(places))
                    if options.swap_cpu_sets and sets:
                        places = turn_places(servers, sets, places)
                    cycle_s = time.time() - cycle_began
                    result["cycles"][order_text] = [{a: round(t, 4) for a, t in c.items()} for c in cycles]
                    result["summary"] = summary(by_order)
                    (out / ("server_ab_%s.json" % mode)).write_text(json.dumps(result, indent=2))
            finally:
                for arm, server in servers.items():
                    facts.setdefault("stopped_clean", {})[arm] = stop(server["process"])
                    text = server["log"].read_text(errors="replace")
                    facts.setdefault("hotfix_lines", {})[arm] = [
                        line for line in text.splitlines() if "sglang-hotfix-trtllm" in line
                    ][:20]
                    facts.setdefault("decode_graph_lines", {})[arm] = text.count("cuda graph: True")
                    facts.setdefault("kv_lines", {})[arm] = [
                        line[-200:] for line in text.splitlines() if "max_total_num_tokens" in line
                    ][:4]
                    facts.setdefault("decode_tokens_per_s", {})[arm] = decode_throughputs(text)
                    (out / (server["log"].name)).write_text(text[-60000:])
            result["summary"] = summary(by_order)
            result["decode_summary"] = decode_summary(result["orders"])
            (out / ("server_ab_%s.json" % mode)).write_text(json.dumps(result, indent=2))
    print(json.dumps(result["summary"], indent=2))
    print(json.dumps(result["decode_summary"], indent=2))
    print(json.dumps(result["orders"], indent=2)[:6000])


if __name__ == "__main__":
    main()
