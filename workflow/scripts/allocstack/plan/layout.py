"""Where a run's files are: every path of ``results/<run>/`` and ``<state_dir>/<run>/``, spelled once.

``results/<run>/`` holds what the run leaves (its records, the success marker, the timeline,
the decision record) and the service files of Snakemake's service jobs; ``<state_dir>/<run>/``
what must outlive the job (the results journal) and, with more than one node, what the nodes
share (the endpoints published for them and their event logs; :mod:`allocstack.common.names` names
the files in it, as in job-scoped scratch). The rules declare these paths, the plan's command
lines pass them, the end-of-run summary (:mod:`allocstack.status.summary`) reads them back.

A rule's pattern is the :class:`Layout` of the run ``"{run}"`` (and of ``"{worker}"``,
``"{service}"``, ``"{node}"``); an input function's, that of ``wildcards.run``. Standard
library only: components that run without the plan's packages read it too.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..common import names
from .placement import replica_name

#: Every run's records, below the directory Snakemake runs in.
RESULTS = "results"
#: The success marker: written by verification only after every check passed.
MARKER = "result.json"
#: validate_inputs' summary (digests, task count), the first file of a run.
INPUTS_SUMMARY = "inputs.json"
#: The decision record (config ``decisions``), written with the summary.
DECISION_RECORD = "decision-record.md"
#: validate_inputs' compact copy of the task set, which the coordinator loads.
COMPACT_TASKS = "tasks.compact"
#: The coordinator's Snakemake service output.
COORDINATOR_SERVICE = "coordinator.service"
#: The coordinator's results document.
COORDINATOR_RESULTS = "results.json"
#: The coordinator's end record (how it ended).
COORDINATOR_END = "coordinator.json"
#: The coordinator's readiness gate record.
COORDINATOR_GATE = "readiness.json"
#: The main program's record (config ``main``: it exited 0).
MAIN_RECORD = "main.json"
#: Serve mode (config ``mode: serve``): the stack is up (every gate passed; how to reach each service), how it
#: served and ended (serve.py), and verification's own record of a verified end (the marker is result.json).
UP_RECORD = "up.json"
SERVED_RECORD = "served.json"
SERVE_VERIFIED = "serve-verified.json"
#: The stack's private network on its node (config network.isolation: private): a service job's file.
STACK_NETWORK = "stack-network.service"
#: Where the stack's group of jobs started (rule open_stack: its node, Slurm job, the CPUs Snakemake sees there).
STACK_JOB = "stack-job.json"
#: Your check's record (your own stack, tasks: null).
CHECK_RECORD = "check.json"
#: How each of your services ended (collect_results).
SERVICES_RECORD = "services.json"
#: Where each component ran (collect_results).
PROVENANCE = "provenance.json"
#: The run's timeline (collect_results).
TIMELINE = "timeline.svg"
#: A worker's record is WORKERS/<worker>.json; with more than one worker per job step,
#: WORKERS/<step>/<worker>.json (the step's directory is its Snakemake output).
WORKERS = "workers"
#: Where the rules' logs are (``logs/<rule>/<run>...``); a step's workers each log to
#: ``LOGS/run_workers/<run>/<worker>.log`` beside the step's own log.
LOGS = "logs"
#: A service of yours has SERVICES/<name>.service and SERVICES/<name>-readiness.json.
SERVICES = "services"
#: An init job's record (config ``init_jobs``: it exited 0) is INIT/<name>.json.
INIT = "init"
#: With more than one node, node N's gate record is GATES/node-N.json.
GATES = "gates"
SERVICE_SUFFIX = ".service"
#: What an attempt's records of a run that ended without its marker are moved into by the next command
#: (every file of ``results/<run>/`` but :data:`BEFORE_THE_STACK`): its stack runs again from the start.
EARLIER_ATTEMPT = "earlier-attempt"
#: validate_inputs' files: made before any component starts, not an attempt's.
BEFORE_THE_STACK = (INPUTS_SUMMARY, DECISION_RECORD, COMPACT_TASKS)


class File:
    """A file of a run as an attribute of its :class:`Layout`: its path, a string, below ``results/<run>``
    (or with ``state=True`` below ``<state_dir>/<run>``)."""

    def __init__(self, name: str, state: bool = False) -> None:
        self.name, self.state = name, state

    def __get__(self, layout: Layout, owner: type | None = None) -> str:
        return f"{layout.state if self.state else layout.results}/{self.name}"

    @classmethod
    def each(cls, *names: str, state: bool = False) -> tuple[File, ...]:
        """A :class:`File` for each name, for declaring a group of them on one line."""
        return tuple(cls(name, state) for name in names)


@dataclass(frozen=True)
class Layout:
    """The files of one run (``run`` may be the wildcard ``"{run}"``)."""

    run: str
    state_dir: str = "state"

    # validate_inputs'; the coordinator's (its service output, results, end record, gate record)
    inputs_summary, decision_record, compact_tasks = File.each(INPUTS_SUMMARY, DECISION_RECORD, COMPACT_TASKS)
    coordinator_service, coordinator_results, coordinator_end, coordinator_gate = File.each(
        COORDINATOR_SERVICE, COORDINATOR_RESULTS, COORDINATOR_END, COORDINATOR_GATE)
    # collect_results' (the merged event log first); your check's, your main program's, verification's
    events, provenance, services_record, timeline = File.each(names.EVENTS, PROVENANCE, SERVICES_RECORD, TIMELINE)
    check_record, main_record, marker = File.each(CHECK_RECORD, MAIN_RECORD, MARKER)
    # serve mode's; the stack's private network's service file (config network.isolation: private)
    up_record, served_record, serve_verified, stack_network = File.each(
        UP_RECORD, SERVED_RECORD, SERVE_VERIFIED, STACK_NETWORK)
    # rule open_stack's: where the stack's group of jobs started
    stack_job = File(STACK_JOB)
    # In the state directory: the durable results journal a rerun resumes from; with more than one node, the
    # coordinator's endpoint document for the other nodes and the directory of your services published for them.
    journal, shared_endpoint, shared_services = File.each(names.JOURNAL, names.ENDPOINT, names.SERVICES, state=True)

    @property
    def results(self) -> str:
        """``results/<run>``: the run's records."""
        return f"{RESULTS}/{self.run}"

    @property
    def main_log(self) -> str:
        """Your main program's log (rule run_main), where main.py says how it failed."""
        return f"{LOGS}/run_main/{self.run}.log"

    @property
    def state(self) -> str:
        """``<state_dir>/<run>`` (0700, on the filesystem every node shares)."""
        return f"{self.state_dir}/{self.run}"

    def worker_record(self, worker: str, step: str | None = None) -> str:
        """``worker``'s record; in ``step``'s directory when its job step runs more than one worker."""
        return f"{self.step_records(step) if step else f'{self.results}/{WORKERS}'}/{names.worker_record(worker)}"

    def step_records(self, step: str) -> str:
        """The directory of the records of a job step's workers (``step``: ``workers-01``), its Snakemake output."""
        return f"{self.results}/{WORKERS}/{step}"

    @property
    def step_logs(self) -> str:
        """The logs of the job steps of workers (``<step>.log``) and of each of their workers (``<worker>.log``)."""
        return f"{LOGS}/run_workers/{self.run}"

    def step_log(self, step: str) -> str:
        return f"{self.step_logs}/{step}.log"

    def service_file(self, service: str) -> str:
        return f"{self.results}/{SERVICES}/{service}{SERVICE_SUFFIX}"

    def service_gate(self, service: str) -> str:
        return f"{self.results}/{SERVICES}/{service}-readiness.json"

    def instance_file(self, service: str, node: int | str) -> str:
        """The service file of global service ``service``'s instance on node ``node`` (1-based, above 1)."""
        return f"{self.results}/{SERVICES}/{service}-node-{node}{SERVICE_SUFFIX}"

    def replica_file(self, service: str, replica: int | str) -> str:
        """The service file of replica ``replica`` of service ``service`` (2..: the first is the service itself)."""
        return f"{self.results}/{SERVICES}/{replica_name(service, replica)}{SERVICE_SUFFIX}"

    def replica_gate(self, service: str, replica: int | str) -> str:
        """The gate record of replica ``replica`` (2..) of service ``service``."""
        return self.service_gate(replica_name(service, replica))

    def instance_gate(self, service: str, node: int | str) -> str:
        """The gate record of global service ``service``'s instance on node ``node`` (1-based, above 1)."""
        return f"{self.results}/{SERVICES}/{service}-node-{node}-readiness.json"

    def init_record(self, name: str) -> str:
        """Init job ``name``'s record, written when it exited 0: its dependents' gate."""
        return f"{self.results}/{INIT}/{name}.json"

    def node_network(self, node: int | str) -> str:
        """The service file of the stack's private network on node ``node`` (1-based, above 1)."""
        return f"{self.results}/network/node-{node}{SERVICE_SUFFIX}"

    def node_gate(self, node: int | str) -> str:
        """The gate record of node ``node`` (1-based, above 1): it reached the coordinator."""
        return f"{self.results}/{GATES}/node-{node}.json"

    def shared_service_endpoint(self, service: str) -> str:
        """With more than one node: where service ``service`` is published for the other nodes."""
        return f"{self.state}/{names.service_endpoint(service)}"

    def shared_events(self, component: str) -> str:
        """With more than one node: ``component``'s event log in the shared state directory."""
        return f"{self.state}/{names.component_events(component)}"


def is_service_file(path: str) -> bool:
    """A service output of a run (``results/<run>/coordinator.service``, ``.../services/NAME.service``)."""
    return path.startswith(f"{RESULTS}/") and path.endswith(SERVICE_SUFFIX)
