#!/usr/bin/env python3
"""Make the run's scratch on this node, then exec the step's command; as the task epilog, release it.

launch.py runs this on the node of a job step off the first node (see allocstack/launch/nodescratch.py)::

    srun --task-epilog=node_scratch.py ... python3 node_scratch.py [--dir DIR]... [--hosts-name S=N,...]... -- COMMAND...

With a command: make ``$ALLOCSTACK_SCRATCH`` (0700, ours) and each ``--dir`` in it on this node,
record ``$ALLOCSTACK_STEP`` as using it, write the stack's hosts file there (``--hosts-name``, once per node:
allocstack/launch/hostsfile.py), and exec COMMAND (with ``--network-holder``, in this node's namespace of the
stack's private network, once its holder published it: ``nsenter ... -- COMMAND``) (the runtime: ``apptainer exec``,
``ch-run``, or python3). Without one (slurmstepd runs it so once the step's process ended):
forget the step, and remove the run's scratch on this node when it was the last one there.

Exit codes: 69 the scratch is unsafe or cannot be made, or COMMAND cannot start (it never
runs); 74 the scratch cannot be removed; 64 bad arguments or not inside a step launch.py started.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from allocstack.common.cli import ArgumentParser, run
from allocstack.common.errors import EXIT_OK, AllocstackError, report
from allocstack.launch.nodescratch import STEP_ENV, enter, leave, step_facts


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, action="append", default=[],
                        help="a directory the runtime needs in the run's scratch (repeatable)")
    parser.add_argument("--hosts-name", action="append", default=[], metavar="SERVICE=NAME,...",
                        help="a service of the stack and its other names: the stack's hosts file on this node "
                             "(allocstack/launch/hostsfile.py; repeatable)")
    parser.add_argument("--network-holder", metavar="COMPONENT",
                        help="the stack's private network: run COMMAND in this node's namespace, once its holder "
                             "(that component) published it (allocstack/launch/stacknet.py)")
    parser.add_argument("command", nargs="*", help="-- COMMAND...: what the step runs (none: the task epilog)")
    args = parser.parse_args(argv)
    try:
        scratch, component = step_facts(os.environ)
        if not args.command:
            leave(scratch, component)
            return EXIT_OK
        if not all(d.is_absolute() and d.is_relative_to(scratch) for d in args.dir):
            parser.error(f"--dir must be inside {scratch}")
        enter(scratch, component, args.dir)
        if args.hosts_name:
            from allocstack.launch.hostsfile import write_named

            write_named(scratch, args.hosts_name)
        if args.network_holder:
            from allocstack.launch import stacknet

            held = stacknet.await_held(scratch, component, args.network_holder)
            args.command = [*stacknet.join_prefix(held), *args.command]
        environ = {name: value for name, value in os.environ.items() if name != STEP_ENV}  # the component's as before
        try:
            os.execvpe(args.command[0], args.command, environ)  # noqa: S606 - an argv list; returns only by raising
        except OSError as exc:
            leave(scratch, component)
            raise AllocstackError("prerequisite", f"cannot start {args.command[0]} on {os.uname().nodename}: "
                                                  f"{exc.strerror}") from exc
    except AllocstackError as error:
        return report(error)


if __name__ == "__main__":
    sys.exit(run(main))
