#!/usr/bin/env python3
"""The stack's own network on this node (config ``network.isolation: private``): made, held, and taken down.

A Compose stack's services share a private network that no one outside the stack reaches. This job is that
network for one node of the allocation: a service job that every component of the stack consumes, so Snakemake
keeps it up while any of them runs and stops it (SIGTERM) once the last one is done. It

1. forks the holder: a process that makes a user and network namespace (its uid and gid mapped to themselves,
   loopback up: allocstack/launch/stacknet.py ``make_namespace``) and then only waits (it dies with this job);
2. attaches ``pasta`` (Debian's ``passt`` package) to the holder's namespace, from outside it: the namespace's
   way out to servers beyond the stack (a license server, a package index), with no port forwarded in;
3. publishes the holder in ``SCRATCH/network.json`` (0600): launch.py starts every other component of the
   stack on this node through ``nsenter`` into it;
4. with ``--publish NAME``, starts port_sockets.py in the namespace: each published port an owner-only Unix socket
   ``SCRATCH/ports/NAME.sock`` (allocstack/launch/portsockets.py);
5. waits for SIGTERM (the stack is done), SIGINT or SIGHUP, or for the holder or pasta to end by themselves
   (the stack's network is gone: one [network] line, exit 69), then stops both and removes the record.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from allocstack.common.cli import ArgumentParser, run
from allocstack.common.errors import EXIT_OK, AllocstackError, report
from allocstack.launch import stacknet
from allocstack.launch.nodescratch import SCRATCH_ENV

#: How long pasta may take to configure the namespace (it writes its pid file when it has).
PASTA_SECONDS = 20.0
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def fork_holder() -> tuple[int, int]:
    """Fork the holder; return its pid and the read end of a pipe on which it says ``ok`` or why it failed."""
    readable, writable = os.pipe()
    pid = os.fork()
    if pid == 0:  # the holder: never returns
        os.close(readable)
        try:
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: it ends with this job
            for signum in ENDING_SIGNALS:
                signal.signal(signum, signal.SIG_DFL)
            stacknet.make_namespace(os.getuid(), os.getgid())
            os.write(writable, b"ok")
        except OSError as exc:
            os.write(writable, f"{exc.strerror or exc}".encode())
            os._exit(1)
        os.close(writable)
        while True:
            signal.pause()
    os.close(writable)
    return pid, readable


def holder_said(readable: int) -> str:
    with os.fdopen(readable, "rb") as pipe:
        return pipe.read().decode(errors="replace")


def start_pasta(pasta: str, holder: int, scratch: Path) -> subprocess.Popen[bytes]:
    """pasta attached to ``holder``'s namespace; returned once it has configured it (its pid file written)."""
    pid_file = scratch / "pasta.pid"
    pid_file.unlink(missing_ok=True)
    argv = stacknet.pasta_argv(pasta, holder, os.getuid(), pid_file)
    print(f"stack_network: {' '.join(argv)}", flush=True)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + PASTA_SECONDS
    while not (pid_file.exists() and pid_file.read_text(encoding="ascii").strip()):
        if proc.poll() is not None:
            said = proc.stdout.read().decode(errors="replace").strip() if proc.stdout else ""
            raise AllocstackError("network", f"pasta could not give the stack's private network a way out (exit "
                                             f"{proc.returncode}: {said.splitlines()[-1] if said else 'no output'})")
        if time.monotonic() > deadline:
            proc.kill()
            raise AllocstackError("network", f"pasta did not configure the stack's private network within "
                                             f"{PASTA_SECONDS:.0f} s")
        time.sleep(0.02)
    return proc


def start_port_sockets(held: stacknet.Held, scratch: Path, published: list[str]) -> subprocess.Popen[str] | None:
    """port_sockets.py in the namespace: each published port as an owner-only socket in scratch; returned once
    its sockets exist."""
    if not published:
        return None
    argv = [*stacknet.join_prefix(held), sys.executable, str(Path(__file__).with_name("port_sockets.py")),
            f"--scratch={scratch}", *(f"--publish={name}" for name in published)]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    said = proc.stdout.readline().strip() if proc.stdout else ""
    if said != "ready":
        proc.kill()
        raise AllocstackError("network", f"the stack's published ports could not be made sockets in {scratch} "
                                         f"(port_sockets.py exited {proc.wait()})")
    return proc


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pasta", default="pasta", help="pasta's path (Debian package passt)")
    parser.add_argument("--publish", action="append", default=[], metavar="NAME",
                        help="a port published to its owner as SCRATCH/ports/NAME.sock (coordinator: the status page; "
                             "else a service of yours; repeatable)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scratch = Path(os.environ[SCRATCH_ENV])
    stacknet.record_path(scratch).unlink(missing_ok=True)  # an earlier attempt's
    ending: list[int] = []
    for signum in ENDING_SIGNALS:
        signal.signal(signum, lambda signum, _frame: ending.append(signum))
    started = time.monotonic()
    holder, said = fork_holder()
    pasta = sockets = None
    try:
        answer = holder_said(said)
        if answer != "ok":
            raise AllocstackError("network", f"the stack's private network could not be made on this node "
                                             f"({answer}); where the center disables unprivileged user namespaces, "
                                             "set network.isolation: none")
        pasta = start_pasta(args.pasta, holder, scratch)
        held = stacknet.Held(holder, stacknet.started_at(holder) or 0, user=os.getuid() != 0)
        sockets = start_port_sockets(held, scratch, args.publish)
        stacknet.publish(scratch, held)
        print(f"stack_network: the stack's private network is up after {time.monotonic() - started:.3f} s "
              f"(holder {holder}, pasta {pasta.pid})", flush=True)
        while not ending:
            if sockets is not None and sockets.poll() is not None:
                raise AllocstackError("network", f"the stack's published ports' sockets ended (exit {sockets.returncode})")
            if pasta.poll() is not None or os.waitpid(holder, os.WNOHANG) != (0, 0):
                raise AllocstackError("network", "the stack's private network ended before the stack did "
                                                 f"({'pasta' if pasta.poll() is not None else 'its holder'} exited)")
            time.sleep(0.2)
        print(f"stack_network: stopping ({signal.Signals(ending[0]).name})", flush=True)
        return EXIT_OK
    except AllocstackError as error:
        return report(error)
    finally:
        stacknet.record_path(scratch).unlink(missing_ok=True)
        if sockets is not None and sockets.poll() is None:
            sockets.terminate()
            try:
                sockets.wait(timeout=5)
            except subprocess.TimeoutExpired:
                sockets.kill()
        for proc_pid in ([pasta.pid] if pasta is not None and pasta.poll() is None else []) + [holder]:
            try:
                os.kill(proc_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if pasta is not None:
            pasta.wait()
        try:
            os.waitpid(holder, 0)
        except ChildProcessError:
            pass


if __name__ == "__main__":
    sys.exit(run(main))
