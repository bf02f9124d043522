"""Leave the process as soon as a command is done, without the interpreter's teardown.

Once torch and transformers are imported, the interpreter's own exit (clearing ~3000 modules and
~400k objects, then the libraries' static destructors) takes 0.7 s: a tenth of a find-neurons run on
SmolLM2, after its last byte is written. The program (the ``surgery`` script, ``python -m surgery``)
therefore ends a command that succeeded the way the interpreter would have, minus that teardown:
what ``atexit`` registered runs (temporary folders, logging's flush, ``weakref.finalize``), the
standard streams are flushed, then ``os._exit``. Only when no other thread is still running, whose
end the interpreter would wait for; else it exits as usual.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading


def others_running() -> bool:
    """Whether a thread the interpreter would wait for at exit (not a daemon) is still running."""
    main = threading.main_thread()
    return any(t is not main and t.is_alive() and not t.daemon for t in threading.enumerate())


def leave(code: int = 0) -> None:
    """End the process with ``code`` without the interpreter's teardown (see the module docstring);
    returns, doing nothing, when another thread is still running."""
    if others_running():
        return
    atexit._run_exitfuncs()  # what the interpreter runs first at its exit, and the part of it that matters
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: the interpreter's exit would not write it either
            pass
    os._exit(code)
