"""The ``sglang_hotfix_trtllm`` logger, visible even before the host sets up logging.

Standard library only. SGLang's scheduler and workers import the attention
backend before they configure logging, so an INFO line sent through an
unconfigured logging tree would be dropped. When nothing would show our
records, a stderr handler is attached to our logger alone; when the host has
configured handlers, our records go to them and we add nothing.
"""

import logging
import os

LOGGER_NAME = "sglang_hotfix_trtllm"
logger = logging.getLogger(LOGGER_NAME)

_said = set()


def _ensure_visible():
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not logger.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s pid=%(process)d] sglang-hotfix-trtllm %(levelname)s: %(message)s"))
        logger.addHandler(handler)


def say(level, message, *args, once_key=None):
    """Log ``message``; with ``once_key``, only the first time per process
    (later repeats go to DEBUG)."""
    _ensure_visible()
    if once_key is not None:
        key = (once_key, os.getpid())
        if key in _said:
            level = logging.DEBUG
        _said.add(key)
    logger.log(level, message, *args)
