"""A component whose event loop handles its signals ends quietly whatever signal comes last (allocstack/common/
loopsignals.py): CI once found ``Exception ignored when trying to write to the signal wakeup fd ... Bad file
descriptor`` in port_sockets.py's log after an interrupt, a second SIGTERM arriving while asyncio closed the loop.

The window is made certain here: a loop that sends itself SIGTERM the moment it has closed its wakeup fd, before
asyncio removes its handlers (its ``_close_self_pipe``, the step of ``close()`` that opens the window). A real
process, a real signal; and the same loop without :func:`ending_quietly` shows the message, so the test can fail.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import SCRIPTS

COMPONENT = textwrap.dedent(f"""
    import asyncio, os, signal, sys
    sys.path.insert(0, {str(SCRIPTS)!r})
    from allocstack.common.loopsignals import ending_quietly

    class ClosingLoop(asyncio.SelectorEventLoop):
        def _close_self_pipe(self):
            super()._close_self_pipe()
            os.kill(os.getpid(), signal.SIGTERM)  # the second SIGTERM, in the window

    async def component():
        stopped = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
        os.kill(os.getpid(), signal.SIGTERM)  # the first: the component stops
        await stopped.wait()

    quiet = sys.argv[1] == "quiet"
    with asyncio.Runner(loop_factory=ClosingLoop) as runner:
        runner.run(ending_quietly(component(), [signal.SIGTERM]) if quiet else component())
    print("ended", flush=True)
""")


def end(how: str) -> subprocess.CompletedProcess[str]:
    """The component run to its end, ``how``: ``quiet`` through :func:`ending_quietly`, else without it."""
    return subprocess.run([sys.executable, "-c", COMPONENT, how], capture_output=True, text=True, timeout=60,
                          check=False)


def test_a_signal_while_the_loop_closes_leaves_nothing_in_the_log():
    done = end("quiet")
    assert (done.returncode, done.stdout, done.stderr) == (0, "ended\n", "")


def test_without_it_the_same_signal_prints_the_message_ci_found():
    done = end("plain")
    assert "Exception ignored when trying to write to the signal wakeup fd" in done.stderr, done.stderr
    assert "Bad file descriptor" in done.stderr


def test_every_component_that_handles_signals_on_its_loop_ends_through_it():
    """Each script that adds signal handlers to its loop (``loop.add_signal_handler``) runs it through
    :func:`ending_quietly`: a new one without it fails here."""
    handling = sorted(path.name for path in SCRIPTS.glob("*.py") if "add_signal_handler(" in path.read_text())
    assert handling == ["coordinator.py", "port_sockets.py", "worker_block.py"]
    assert all("ending_quietly(" in (SCRIPTS / name).read_text() for name in handling)
