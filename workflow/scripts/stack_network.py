#!/usr/bin/env python3
"""The stack's own network on this node (config ``network.isolation: private``): made, held, and taken down.

A Compose stack's services share a private network that no one outside the stack reaches. This job is that
network for one node of the allocation: a service job that every component of the stack consumes, so Snakemake
keeps it up while any of them runs and stops it (SIGTERM) once the last one is done. It

1. forks the holder: a process that makes a user and network namespace (its uid and gid mapped to themselves,
   loopback up: allocstack/launch/stacknet.py ``make_namespace``) and then only waits (it dies with this job);
2. attaches ``pasta`` (Debian's ``passt`` package) to the holder's namespace, from outside it: the namespace's
   way out to servers beyond the stack (a license server, a package index, the first node), with no port
   forwarded in;
3. publishes the holder in ``SCRATCH/network-HOST.json`` (0600): launch.py (off the first node node_scratch.py, on
   the component's node) starts every other component of the stack on this node through ``nsenter`` into it;
4. with ``--publish NAME``, starts port_sockets.py in the namespace: each published port an owner-only Unix socket
   ``SCRATCH/ports/NAME.sock`` (allocstack/launch/portsockets.py); with ``--inbound NAME`` (the first node of
   more than one: the coordinator, each service the other nodes use), the gateway: a port on the node's address,
   recorded for NAME, whose connections it carries (through the socket ``in-NAME.sock``) to NAME's listener on the
   same port in the namespace; those listeners speak TLS, and a service's lets in only the stack's own tunnels
   (allocstack/launch/tunnel.py), so the gateway carries bytes it cannot read to programs that check who sent them;
5. with ``--forward NAME`` (a node other than the first), starts node_forwards.py in the namespace: each service
   of yours on its own port at the namespace's loopback, carried through its keyed TLS tunnel to the first node;
6. with ``--replica-space NAME`` (a replica of a service that listens, config ``services.<name>.replicas``), one
   more holder and pasta for each: a namespace beside the stack's, published as ``network-HOST.NAME.json``, in
   which that replica alone runs (launch.py ``--network-space``); ``--front PORT=NAME,...`` is that service's port
   in the stack's namespace, carried to its replicas in turn (port_sockets.py), and with ``--relay NAME=FILE``
   (more than one node) relayed to the other nodes as a service's supervisor relays its service;
7. waits for SIGTERM (the stack is done), SIGINT or SIGHUP, or for the holder or pasta to end by themselves
   (the stack's network is gone: one [network] line, exit 69), then stops them all and removes the records.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from allocstack.common.cli import ENDING_SIGNALS, ArgumentParser, run
from allocstack.common.errors import EXIT_OK, AllocstackError, report
from allocstack.common.network import bind_address
from allocstack.launch import portsockets, stacknet, tunnel
from allocstack.launch.nodescratch import SCRATCH_ENV
from allocstack.launch.supervise import die_with_parent

#: How long pasta may take to configure the namespace (it writes its pid file when it has).
PASTA_SECONDS = 20.0


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
            stacknet.make_namespace()
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


def listen_for_other_nodes(address: str, names: list[str]) -> dict[str, socket.socket]:
    """A listening socket on a free port of ``address`` for each of ``names`` (the gateway's way in).

    :raises AllocstackError: ``network`` when ``address`` cannot be bound here.
    """
    listening: dict[str, socket.socket] = {}
    for name in names:
        sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
        try:
            sock.bind((address, 0))
            sock.listen(128)
        except OSError as exc:
            sock.close()
            raise AllocstackError("network", f"cannot listen on {address} for the other nodes ({exc.strerror}); "
                                             "the bind address is config network.interface") from exc
        listening[name] = sock
    return listening


def start_gateway(scratch: Path, listening: dict[str, socket.socket]) -> None:
    """The first node's way in for the other nodes: each connection to ``listening[NAME]`` carried to the socket
    ``in-NAME.sock`` (port_sockets.py, in the namespace), in a thread of this process, until it ends."""
    if not listening:
        return

    async def listen() -> list[asyncio.Server]:
        return [await asyncio.start_server(
                    portsockets.to_socket(portsockets.socket_path(scratch, portsockets.inbound_name(name))), sock=sock)
                for name, sock in listening.items()]

    tunnel.serve_in_thread(listen, "allocstack-gateway")


def start_pasta(pasta: str, holder: int, scratch: Path, template: tuple[str, str] | None,
                space: str = "") -> subprocess.Popen[bytes]:
    """pasta attached to ``holder``'s namespace (``space``: a replica's); returned once it has configured it (its
    pid file written)."""
    # one a node (the scratch may be shared), and one a replica's namespace
    pid_file = scratch / f"pasta-{socket.gethostname()}{f'.{space}' if space else ''}.pid"
    pid_file.unlink(missing_ok=True)
    argv = stacknet.pasta_argv(pasta, holder, os.getuid(), pid_file, template)
    print(f"stack_network: {' '.join(argv)}", flush=True)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=die_with_parent)
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


def start_helper(held: stacknet.Held, script: str, options: list[str], failed: str) -> subprocess.Popen[str]:
    """``script`` (beside this one) in the namespace, with ``options``; returned once it said ``ready``, its further
    lines echoed into this job's log. ``failed``: what could not be done, for the one line if it does not start.
    It ends with this process (parent-death signal), as pasta does: Snakemake SIGKILLs the jobs of a failed run."""
    argv = [*stacknet.join_prefix(held), sys.executable, str(Path(__file__).with_name(script)), *options]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                            preexec_fn=die_with_parent)
    said = proc.stdout.readline().strip() if proc.stdout else ""
    if said != "ready":
        proc.kill()
        raise AllocstackError("network", f"{failed} ({script} exited {proc.wait()}"
                                         f"{f' after it said {said!r}, not ready' if said else ''})")
    threading.Thread(target=echo, args=(proc,), daemon=True).start()
    return proc


def echo(proc: subprocess.Popen[str]) -> None:
    """A helper's own lines into this job's log."""
    for line in proc.stdout or ():
        print(line.rstrip(), flush=True)


def start_port_sockets(held: stacknet.Held, scratch: Path, published: list[str],
                       address: str, args) -> subprocess.Popen[str] | None:
    """port_sockets.py in the namespace: each published port as an owner-only socket in scratch, the way in of
    each of ``held.inbound`` (to ``address`` and its port there) and the front of each service whose replicas listen
    in namespaces of their own (``args.front``: ``PORT=NAME,...``; ``args.relay``: those the other nodes use);
    returned once its sockets exist."""
    if not published and not held.inbound and not args.front:
        return None
    options = [f"--scratch={scratch}", *(f"--publish={name}" for name in published),
               *(f"--inbound={name}={address}:{port}" for name, port in held.inbound.items()),
               *(f"--front={front}" for front in args.front), *(f"--relay={relay}" for relay in args.relay),
               *(["--no-tls"] if args.no_tls else [])]
    return start_helper(held, "port_sockets.py", options,
                        f"the stack's published ports could not be made sockets in {scratch}")


def start_forwards(held: stacknet.Held, scratch: Path, published: Path | None,
                   services: list[str]) -> subprocess.Popen[str] | None:
    """node_forwards.py in the namespace (a node other than the first): each of ``services`` on its own port at the
    namespace's loopback once it is published; returned once it started."""
    if not services or published is None:
        return None
    options = [f"--scratch={scratch}", f"--published={published}", *(f"--forward={name}" for name in services)]
    return start_helper(held, "node_forwards.py", options, "the forwarders of your services could not start on this node")


def parse_args(argv: list[str] | None):
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pasta", default="pasta", help="pasta's path (Debian package passt)")
    parser.add_argument("--inbound", action="append", default=[], metavar="NAME",
                        help="a listener the other nodes use (coordinator, or a service of yours): a port on this "
                             "node's address forwarded in to it (repeatable; the first node of more than one)")
    parser.add_argument("--interface", default="",
                        help="config network.interface: the address the other nodes reach (else the hostname's)")
    parser.add_argument("--forward", action="append", default=[], metavar="NAME",
                        help="a node other than the first: a service of yours the workers here reach on its own port "
                             "(node_forwards.py; repeatable)")
    parser.add_argument("--published", type=Path,
                        help="with --forward: the directory of your services as published for the other nodes")
    parser.add_argument("--publish", action="append", default=[], metavar="NAME",
                        help="a port published to its owner as SCRATCH/ports/NAME.sock (coordinator: the status page; "
                             "else a service of yours; repeatable)")
    parser.add_argument("--replica-space", action="append", default=[], metavar="NAME",
                        help="a replica of a service that listens (NAME, NAME-replica-2, ...): a namespace of its own "
                             "beside the stack's, with its own pasta (repeatable)")
    parser.add_argument("--front", action="append", default=[], metavar="PORT=NAME,...",
                        help="the port of a service whose replicas listen in namespaces of their own, in the stack's "
                             "namespace: each connection carried to the next replica in turn (repeatable)")
    parser.add_argument("--relay", action="append", default=[], metavar="NAME=FILE",
                        help="with --inbound NAME and --front: that front relayed to the other nodes over TLS, "
                             "published in FILE (port_sockets.py; repeatable)")
    parser.add_argument("--no-tls", action="store_true", help="--relay in plain text (config network.tls: false)")
    return parser.parse_args(argv)


def stop(proc: subprocess.Popen | None) -> None:
    """SIGKILL ``proc`` (pasta), if it still runs, and reap it."""
    if proc is not None:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def kill_holder(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scratch = Path(os.environ[SCRATCH_ENV])
    spaces = ["", *args.replica_space]  # the stack's namespace, then each replica's
    for space in spaces:  # an earlier attempt's
        stacknet.record_path(scratch, space=space).unlink(missing_ok=True)
    ending: list[int] = []
    for signum in ENDING_SIGNALS:
        signal.signal(signum, lambda signum, _frame: ending.append(signum))
    started = time.monotonic()
    holders: dict[str, int] = {}
    pastas: dict[str, subprocess.Popen[bytes]] = {}
    sockets = forwards = None
    try:
        for space in spaces:
            holder, said = fork_holder()
            holders[space] = holder
            answer = holder_said(said)
            if answer != "ok":
                raise AllocstackError("network", f"the stack's private network could not be made on this node "
                                                 f"({answer}); where the center disables unprivileged user namespaces, "
                                                 "set network.isolation: none")
        # The node's address: the other nodes' way in, and the interface the namespace copies (pasta's template)
        # where the listeners for them bind it in there (network.interface may not be the default route's), or
        # where the node has no default route (compute nodes often have none; pasta needs a template then)
        routed = stacknet.default_route_interface()
        address = bind_address(args.interface or None, socket.gethostname()) if args.inbound or not routed else ""
        template = stacknet.template_interface(address) if address else None
        listening = listen_for_other_nodes(address, args.inbound)
        inbound = {name: sock.getsockname()[1] for name, sock in listening.items()}
        for space, holder in holders.items():
            pastas[space] = start_pasta(args.pasta, holder, scratch,
                                        template if template and template[0] != routed else None, space)
        held = {space: stacknet.Held(holder, stacknet.started_at(holder) or 0, user=os.getuid() != 0,
                                     inbound=inbound if not space else {}) for space, holder in holders.items()}
        sockets = start_port_sockets(held[""], scratch, args.publish, address, args)
        start_gateway(scratch, listening)
        forwards = start_forwards(held[""], scratch, args.published, args.forward)
        for space in reversed(spaces):  # the stack's last: what waits for it finds the replicas' too
            stacknet.publish(scratch, held[space], space)
        forwarded = "".join(f"; {name} reached by the other nodes at {address}:{port}" for name, port in inbound.items())
        replicas = "".join(f"; replica {space}: holder {holders[space]}, pasta {pastas[space].pid}" for space in spaces[1:])
        print(f"stack_network: the stack's private network is up after {time.monotonic() - started:.3f} s "
              f"(holder {holders['']}, pasta {pastas[''].pid}{forwarded}{replicas})", flush=True)
        while not ending:
            for helper, what in ((sockets, "the stack's published ports' sockets"), (forwards, "the forwarders")):
                if helper is not None and helper.poll() is not None:
                    raise AllocstackError("network", f"{what} ended (exit {helper.returncode})")
            for space, holder in holders.items():
                whose = f"replica {space}'s network" if space else "the stack's private network"
                if pastas[space].poll() is not None or os.waitpid(holder, os.WNOHANG) != (0, 0):
                    raise AllocstackError("network", f"{whose} ended before the stack did "
                                                     f"({'pasta' if pastas[space].poll() is not None else 'its holder'} "
                                                     "exited)")
            time.sleep(0.2)
        print(f"stack_network: stopping ({signal.Signals(ending[0]).name})", flush=True)
        return EXIT_OK
    except AllocstackError as error:
        return report(error)
    finally:
        for space in spaces:
            stacknet.record_path(scratch, space=space).unlink(missing_ok=True)
        for helper in (sockets, forwards):
            if helper is not None and helper.poll() is None:
                helper.terminate()
                try:
                    helper.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    helper.kill()
        for pasta in pastas.values():
            stop(pasta)
        for holder in holders.values():
            kill_holder(holder)


if __name__ == "__main__":
    sys.exit(run(main))
