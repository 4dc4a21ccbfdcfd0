"""SIGTERM and SIGINT in a fabricbench process: an exception that is remembered.

SIGTERM is handled as Ctrl-C is: a `KeyboardInterrupt` (here `Terminated`, exit 143) that the
record writers turn into an "interrupted" record. Python raises a handler's exception in the
main thread at the next bytecode boundary, wherever that is; when that is inside a callback
whose exceptions Python cannot propagate (a weakref callback, such as the import system's
module-lock cleanup, or a `__del__`), it prints "Exception ignored in ..." and drops it. The
rank then carries on as if never signalled and later fails on a peer that did stop (seen in CI:
a Gloo "Connection closed by peer" traceback in place of the one "interrupted" line). So:

- the handler notes the signal (`received()`);
- an interruption dropped inside such a callback is not printed, and is raised again from the
  main thread's own code a moment later. Cython's `noexcept` callbacks (uvloop's getaddrinfo
  callback, met in the fast lane) print what they drop through `sys.excepthook` before handing
  it to `sys.unraisablehook` (Cython's `__Pyx_WriteUnraisable`): a noted signal's own exception
  is kept out of both;
- an error that follows the signal is reported as the interruption it follows from
  (`interruption()`), by the entry point and by the record.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager

# After SIGTERM a rank has this long to write its record; a rank blocked in a collective whose
# peers are gone must still exit.
TERM_GRACE_S = 20.0
REDELIVER_S = 0.05  # long enough for the callback that dropped the interruption to have returned

_received: int | None = None
_grace_s: float | None = TERM_GRACE_S


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled wherever Ctrl-C is (records say "interrupted"), exit 143."""

    exit_code = 128 + signal.SIGTERM


def _noted(signum: int) -> None:
    global _received
    _received = signum
    # Hydra prints (and exits 1 on) any Exception that escapes its multirun machinery. A signal's
    # exception raised inside library code there can come out as another one (OmegaConf's
    # flag_override turned one into "AttributeError: 'NoneType' object has no attribute
    # '_invalidate_flags_cache'" between two jobs of a sweep, a full run's traceback wall): with
    # this set Hydra re-raises it instead, and the entry point says "interrupted" (commands/entry.py).
    os.environ["HYDRA_FULL_ERROR"] = "1"


def _on_sigterm(signum, frame):
    _noted(signum)
    if _grace_s is not None:
        timer = threading.Timer(_grace_s, os._exit, (128 + signum,))
        timer.daemon = True
        timer.start()
    raise Terminated(f"received signal {signum}")


def _on_sigint(signum, frame):
    _noted(signum)
    raise KeyboardInterrupt


@contextmanager
def grace(seconds: float | None):
    """SIGTERM's grace timer while the body runs; None while this process owns something whose
    own stop may take longer (an engine server: the `with` that owns it stops it on the way out,
    and a timer's os._exit would orphan it)."""
    global _grace_s
    before, _grace_s = _grace_s, seconds
    try:
        yield
    finally:
        _grace_s = before


def ending(status: int) -> None:
    """This process is ending with `status` (dist.exit_process runs its exit functions and joins
    its threads): a SIGTERM or SIGINT now ends it at once with that status. Raised as usual, the
    signal's exception escaped the exit path as a traceback of every exception before it (seen in
    a full run: a rank that had reported "a peer rank left" got torchrun's SIGTERM while flushing)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def now(signum, frame):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a write the signal interrupted; exiting regardless
                pass
        os._exit(status & 0xFF)

    signal.signal(signal.SIGTERM, now)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, now)


def hold(signums) -> tuple[dict[int, object], list[int]]:
    """Until `release`, `signums` are only noted. A blocked mask would not do: torch's own threads
    would still take the signal, and the main thread would run its handler at the next bytecode
    boundary, wherever that is. Main thread only (where handlers may be set)."""
    noted: list[int] = []
    before = {s: signal.getsignal(s) for s in signums}
    for s in before:
        signal.signal(s, lambda signum, frame: noted.append(signum))
    return before, noted


def release(before: dict[int, object], noted: list[int]) -> None:
    """The handlers `hold` replaced, back; a signal noted meanwhile now reaches them."""
    for s, handler in before.items():
        signal.signal(s, handler if handler is not None else signal.SIG_DFL)
    if noted:
        signal.raise_signal(noted[0])


def received() -> int | None:
    """The signal this process was asked to stop by, if any."""
    return _received


def interruption() -> KeyboardInterrupt:
    """The exception that the noted signal raises (call only once `received()`)."""
    if _received == signal.SIGTERM:
        return Terminated(f"received signal {_received}")
    return KeyboardInterrupt()


def install() -> None:
    """In the main thread of an entry point, before any work."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where SIGINT is ignored
        signal.signal(signal.SIGINT, _on_sigint)
    global _next_hook, _next_excepthook
    if sys.unraisablehook is not _unraisable:
        _next_hook = sys.unraisablehook
        sys.unraisablehook = _unraisable
    if sys.excepthook is not _excepthook:
        _next_excepthook = sys.excepthook
        sys.excepthook = _excepthook


_next_hook = sys.__unraisablehook__
_next_excepthook = sys.__excepthook__


def _excepthook(exc_type, exc, tb) -> None:
    # The signal's own exception is the interruption the entry point reports in one line; its
    # traceback says nothing (where the signal happened to land) and breaks that line.
    if issubclass(exc_type, KeyboardInterrupt) and _received is not None:
        return
    _next_excepthook(exc_type, exc, tb)


def _timer_joined_itself(u) -> bool:
    """torch's rendezvous keep-alive timer (elastic/rendezvous/utils.py, _PeriodicTimer) stops
    itself from a weakref finalizer, which runs in whichever thread drops the timer's last
    reference; when that is the timer's own thread, `join` raises "cannot join current thread"
    after the stop event is already set, so the thread ends regardless. Python prints it as
    "Exception ignored in: <finalize object>" with a traceback (1 launcher in ~35 under load, after
    its one "interrupted" line): nothing the user can act on."""
    if not (isinstance(u.exc_value, RuntimeError) and "cannot join current thread" in str(u.exc_value)):
        return False
    tb = u.exc_traceback
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "_stop_thread" and code.co_filename.replace("\\", "/").endswith("rendezvous/utils.py"):
            return True
        tb = tb.tb_next
    return False


def _unraisable(u) -> None:
    if _timer_joined_itself(u):
        return
    if isinstance(u.exc_value, KeyboardInterrupt) and _received is not None:
        # Sent from a thread a moment later, so that it lands outside the callback; sent to the
        # main thread alone, so that it also wakes a blocking call there, as the first one did.
        t = threading.Timer(REDELIVER_S, signal.pthread_kill, (threading.main_thread().ident, _received))
        t.daemon = True
        t.start()
        return
    _next_hook(u)


def stop_group(p: subprocess.Popen, first: int = signal.SIGTERM, wait_s: float = 5.0, kill_wait_s: float = 5.0) -> None:
    """Stop a child started in its own session, with everything in its process group: `first`
    (SIGINT for a tool that writes its summary on it), then SIGKILL if it has not ended within
    `wait_s`. A group already gone ends it."""
    for sig, wait in ((first, wait_s), (signal.SIGKILL, kill_wait_s)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
