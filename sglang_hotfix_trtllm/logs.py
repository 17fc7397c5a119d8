"""The ``sglang_hotfix_trtllm`` logger, visible even before the host sets up logging.

Standard library only; never raises into the host. SGLang's scheduler and
workers import the attention backend before they configure logging, so an
INFO line sent through an unconfigured logging tree would be dropped. Our
logger therefore carries one handler of its own, ``_FallbackHandler``, which
writes a record only while no handler above our logger would show it: each
line appears exactly once whether the host configures logging before or
after our first line. It writes to whatever ``sys.stderr`` is at that moment,
and not at all when stderr is None, closed or a broken pipe.
"""

import logging
import os

import sglang_hotfix_trtllm_autoload

LOGGER_NAME = "sglang_hotfix_trtllm"
logger = logging.getLogger(LOGGER_NAME)
# Every message starts with the package's name: under the host's logging configuration (SGLang's
# ``[%(asctime)s] %(message)s``) the line must still say whose it is, for ``grep sglang-hotfix-trtllm``.
PREFIX = "sglang-hotfix-trtllm: "

_said = set()


def _handled_above(record):
    """True when a handler of an ancestor logger will take this record."""
    current = logger
    while current.propagate and current.parent is not None:
        current = current.parent
        if any(record.levelno >= handler.level for handler in current.handlers):
            return True
    return False


class _FallbackFormatter(logging.Formatter):
    """The fallback's own line names the package before the level; the message's prefix is left out
    there (said once per line)."""

    def formatMessage(self, record):
        message = record.message
        if not message.startswith(PREFIX):
            return super().formatMessage(record)
        record.message = message[len(PREFIX) :]
        try:
            return super().formatMessage(record)
        finally:
            record.message = message


class _FallbackHandler(logging.Handler):
    def __init__(self):
        super().__init__()
        self.setFormatter(
            _FallbackFormatter("[%(asctime)s pid=%(process)d] sglang-hotfix-trtllm %(levelname)s: %(message)s")
        )

    def emit(self, record):
        try:
            if _handled_above(record):
                return
            text = self.format(record) + "\n"
        except Exception:
            return
        sglang_hotfix_trtllm_autoload.write_stderr(text)  # never raises: stderr closed or a broken pipe

    def handleError(self, record):
        pass


def _ensure_visible():
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not any(isinstance(handler, _FallbackHandler) for handler in logger.handlers):
        logger.addHandler(_FallbackHandler())


def say(level, message, *args, once_key=None):
    """Log ``message``; with ``once_key``, only the first time per process
    (later repeats go to DEBUG). Never raises."""
    try:
        _ensure_visible()
        if once_key is not None:
            key = (once_key, os.getpid())
            if key in _said:
                level = logging.DEBUG
            _said.add(key)
        logger.log(level, PREFIX + message, *args)
    except Exception:
        pass


def repair_skipped(target, record, error, kind=None):
    """A record's wrapper could not compute its repair for one call (a model
    runner without an attribute the repair reads, say): SGLang's own result is
    left as it is. One WARNING per process, record and ``kind`` (a record whose
    repair can be skipped for different reasons names them, so that an expected
    one does not hide the others); never raises."""
    say(
        logging.WARNING,
        "not repairing a call of %s (record %s): %s: %s; SGLang's own result is left as it set it "
        "(logged once per process)",
        target,
        record,
        type(error).__name__,
        error,
        once_key=("repair-skipped", record, kind),
    )
