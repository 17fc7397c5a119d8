"""A running server reports itself: one Prometheus gauge sample per applied record.

SGLang started with ``--enable-metrics`` sets ``PROMETHEUS_MULTIPROC_DIR`` (in
the server process, before it spawns its schedulers) and serves ``/metrics``
from every process's files in that folder through prometheus_client's
``MultiProcessCollector``. When that variable is set and ``prometheus_client``
imports, each process that applies a record sets the sample

    sglang_hotfix_trtllm_applied{record="pr26521",sglang_version="0.5.12",fingerprint="ast1:..."} 1.0

(multiprocess mode ``max``: one sample per record across the server's
processes), so ``/metrics`` of every server in a fleet says which records it
runs with. After ``remove()`` the process's samples read 0. When the variable
is unset, nothing is imported and nothing is written. Never raises into the host:
a metrics failure costs one DEBUG line.
"""

import logging
import os

from .logs import say

MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"
GAUGE_NAME = "sglang_hotfix_trtllm_applied"
LABELS = ("record", "sglang_version", "fingerprint")

_gauge = None
_set = []  # the label sets this process set to 1


def report_removed():
    """``remove()`` ran: this process's samples read 0 (a multiprocess sample stays in its file once
    written, so it is set to 0, not taken away). Never raises."""
    try:
        while _set:
            _gauge.labels(**_set.pop()).set(0)
    except Exception as error:
        say(logging.DEBUG, "could not set the removed records' samples to 0: %s: %s", type(error).__name__, error)


def report_applied(hotfix, sglang_version, fingerprint):
    """Set this record's sample to 1 in this process; True when written."""
    global _gauge
    folder = os.environ.get(MULTIPROC_DIR)
    if not folder:
        return False
    if not os.path.isdir(folder):
        # Set by hand to a folder that is not there: prometheus_client cannot write the sample and
        # /metrics would silently lack the hotfix's lines.
        say(
            logging.WARNING,
            "not reporting the applied records to Prometheus: %s=%s is not a folder (SGLang's "
            "--enable-metrics creates its own; create this one, or unset the variable)",
            MULTIPROC_DIR,
            folder,
            once_key="metrics-folder",
        )
        return False
    try:
        import prometheus_client
        from prometheus_client import values

        if not getattr(values.ValueClass, "_multiprocess", False):
            # prometheus_client was imported before the folder was set: its samples would stay in
            # this process, where SGLang's collector never reads them.
            say(
                logging.DEBUG,
                "not reporting %s to Prometheus: prometheus_client is not in multiprocess mode",
                hotfix.name,
            )
            return False
        if _gauge is None:
            _gauge = prometheus_client.Gauge(
                GAUGE_NAME,
                "1 for each sglang-hotfix-trtllm record applied in this server's processes",
                LABELS,
                registry=None,
                multiprocess_mode="max",
            )
        labels = dict(
            record=hotfix.name, sglang_version=sglang_version or "unknown", fingerprint=fingerprint or "unknown"
        )
        _gauge.labels(**labels).set(1)
        _set.append(labels)
        return True
    except Exception as error:  # no prometheus_client, an unwritable folder: the patch stands regardless
        say(logging.DEBUG, "not reporting %s to Prometheus: %s: %s", hotfix.name, type(error).__name__, error)
        return False
