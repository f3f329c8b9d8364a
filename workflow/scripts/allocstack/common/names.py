"""The names allocstack spells once: the files a run's components share, and the variables derived from yours.

Job-scoped scratch (``ROOT/allocstack-UID/RUN.CHECKOUT[.JOB]``, see :mod:`scratch`) holds what a
running stack publishes; the run's state directory (config ``state_dir``) holds
what must outlive the job. With more than one node (config ``nodes``), the state
directory, on the filesystem every node shares, also holds what the other nodes
read: ``ENDPOINT`` and ``SERVICES/<name>.json`` as published for them (network
address, TLS fingerprint; 0600), and the event logs written there
(``EVENTS_DIR/<name>.jsonl``), the same names as in scratch. Standard library only: the rules load this file by its
path (common.smk), the scripts import it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

#: In scratch: the coordinator's URL and tokens (mode 0600), read by the gate, workers, status.
ENDPOINT = "endpoint.json"
#: In scratch: the stack's private network on node HOST, its holder's pid (config network.isolation: private):
#: ``network-HOST.json``, one a node, as a run's scratch may be on a filesystem every node shares.
NETWORK = "network"
#: Set to ``private`` in every component launch.py started in the stack's private network: what its programs listen
#: on is the stack's alone (allocstack/common/listening.py).
NETWORK_ENV = "ALLOCSTACK_NETWORK"


def in_private_network(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` is a component's in the stack's private network (``$ALLOCSTACK_NETWORK``)."""
    return environ.get(NETWORK_ENV) == "private"

#: In scratch, in the stack's private network: each published port as an owner-only socket PORTS/NAME.sock
#: (allocstack/launch/portsockets.py); the built-in coordinator's status page is PORTS/coordinator.sock.
PORTS = "ports"
COORDINATOR_PORT = "coordinator"
#: In scratch: the coordinator's event log (one JSON object per line), merged into results/<run>/ by collect.
EVENTS = "events.jsonl"
#: In scratch: each service of yours publishes ``SERVICES/<name>.json`` and its supervisor records its end there.
SERVICES = "services"
#: In scratch: the event log of every other component, ``EVENTS_DIR/<name>.jsonl`` (the coordinator clears EVENTS).
EVENTS_DIR = "events"
#: In scratch: the named volumes, ``VOLUMES/<name>``.
VOLUMES = "volumes"
#: In scratch: each program of yours that runs in an image, ``PROGRAMS/<component>``: its variables for ch-run,
#: Charliecloud's mount-point tree, the read-only views of its mounts.
PROGRAMS = "programs"
#: In scratch: the stack's hosts file (its service names at 127.0.0.1, then the node's own ``/etc/hosts``), bound at
#: ``/etc/hosts`` for every program of yours (allocstack/launch/hostsfile.py).
HOSTS = "hosts"
#: In scratch: the prefix of a large task payload handed to ``worker.command`` as a file.
PAYLOAD_PREFIX = "payload-"
#: In scratch: how each component's process ended, as its launcher saw it (``ENDED_DIR/<component>.json``).
ENDED_DIR = "ended"
#: In scratch: the main program's end (config ``main``), which tells the workers to stop.
MAIN_ENDED = "main-ended.json"
#: In the state directory: the durable results journal a rerun resumes from.
JOURNAL = "journal.jsonl"


# Files named after a component: each a function of the name (``worker_record("worker-01")`` is
# ``"worker-01.json"``).
#: A worker's record (``worker-01.json``), in ``results/<run>/workers/`` or its step's directory there.
worker_record = "{}.json".format
#: A worker's own log (``worker-01.log``) in its step's log directory (more than one worker per step).
worker_log = "{}.log".format
#: In scratch: where a step of workers publishes its relay to the coordinator for its workers (mode 0600).
relay_endpoint = "relay-{}.json".format
#: In scratch: where your own service publishes its URL and token (mode 0600).
service_endpoint = (SERVICES + "/{}.json").format
#: In scratch: where the supervisor of a service records how it ended (read by collect_results).
service_end = (SERVICES + "/{}.end.json").format
#: In scratch: the event log of a component other than the coordinator (a service, its gate, a replica, the check).
component_events = (EVENTS_DIR + "/{}.jsonl").format
#: In scratch: how a component's process ended, written by its launcher (read by the gate that waits for it).
component_ended = (ENDED_DIR + "/{}.json").format


#: Your own service names (config ``services``, Compose service names).
SERVICE_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
VOLUME_PREFIX = "ALLOCSTACK_VOLUME_"


def upper_name(name: str) -> str:
    """A name as a part of a variable name: upper-cased, every character but letters and digits as ``_``."""
    return re.sub(r"[^A-Z0-9]", "_", name.upper())


def variable_prefix(service: str) -> str:
    """``ALLOCSTACK_<NAME>_``: the prefix of the variables that tell a program where ``service`` listens."""
    return f"ALLOCSTACK_{upper_name(service)}_"


def volume_variable(volume: str) -> str:
    """``ALLOCSTACK_VOLUME_<NAME>``: the variable naming a named volume's directory."""
    return VOLUME_PREFIX + upper_name(volume)
