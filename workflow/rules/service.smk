# Stage 1b (config `services`, or the single `service:` block as `app`): your own
# long-running services (Compose: each service the workers use), run like the
# coordinator - a service job on loopback with a published endpoint and token -
# each with its own readiness gate. A service starts after the gates of its
# depends_on passed (their gate records are its sentinels) and consumes their
# service files; the workers (and your check) consume every service file, so
# all of them live until those are done. Snakemake never checks a service's
# exit status: its supervisor records how it ended, and verification checks it.
# Its service file is created first thing, as the coordinator's is (coordinator.smk).
# With config nodes above 1 every service runs on the first node, on its loopback as
# with one node, and is relayed to the other nodes over TLS (allocstack/launch/tunnel.py).


rule serve_service:
    input:
        network=network_held,
        validated=FILES.inputs_summary,
        dependencies=service_dependencies,
        script=script("app_service.py"),
    output:
        service=service(FILES.service_file("{service}")),
    log:
        "logs/serve_service/{run}/{service}.log",
    retries: PLAN.retries
    group:
        "stack"
    conda:
        STACK_ENV
    threads: 0
    resources:
        cpus_per_task=service_cpus,
        gpu=service_gpus,
    params:
        launch=launch("service"),
        # With more than one node: relayed over TLS to the first node's network address too.
        args=args("service"),
    shell:
        ": > {output.service}; exec {params.launch} {input.script} {params.args} > {log} 2>&1"


rule await_service:
    input:
        network=network_held,
        service=FILES.service_file("{service}"),
        script=script("readiness.py"),
    output:
        FILES.service_gate("{service}"),
    log:
        "logs/await_service/{run}/{service}.log",
    retries: PLAN.retries
    group:
        "stack"
    conda:
        STACK_ENV
    threads: 0
    params:
        launch=launch("service_gate"),
        args=args("service_gate"),
    shell:
        "exec {params.launch} {input.script} {params.args} > {log} 2>&1"


# A global service (services.<name>.mode: global, Compose deploy.mode: global) with config nodes
# above 1: the first node's instance is the service above; one more instance on each other node,
# a job step pinned there, with its own gate run on that node. The workers on a node wait for
# their node's gate and use their node's instance (its loopback: ALLOCSTACK_<NAME>_HOST 127.0.0.1).
if PLAN.global_services:

    rule serve_instance:
        input:
            validated=FILES.inputs_summary,
            script=script("app_service.py"),
        output:
            service=service(FILES.instance_file("{service}", "{node}")),
        log:
            "logs/serve_service/{run}/{service}-node-{node}.log",
        retries: PLAN.retries
        group:
            "stack"
        conda:
            STACK_ENV
        threads: 0
        resources:
            # The first node's job carries the CPUs per node, these instances' too.
            cpus_per_task=0,
        params:
            launch=launch("instance"),
            args=args("instance"),
        shell:
            ": > {output.service}; exec {params.launch} {input.script} {params.args} > {log} 2>&1"

    rule await_instance:
        input:
            service=FILES.instance_file("{service}", "{node}"),
            script=script("readiness.py"),
        output:
            FILES.instance_gate("{service}", "{node}"),
        log:
            "logs/await_service/{run}/{service}-node-{node}.log",
        retries: PLAN.retries
        group:
            "stack"
        conda:
            STACK_ENV
        threads: 0
        params:
            launch=launch("instance_gate"),
            args=args("instance_gate"),
        shell:
            "exec {params.launch} {input.script} {params.args} > {log} 2>&1"


# A service of more than one replica (services.<name>.replicas, Compose deploy.replicas / --scale):
# the first is the service above; each further one (NAME-replica-K) is a service job and a job step
# of its own, supervised as the service is (its log, restart policy and end record), with a gate of
# its own where the service has one: what depends on the service waits for every replica's. The
# workers and the check consume every replica's service file, so the stack stops them all as it
# stops a service. A service with a port runs each replica in a network of its own on that port,
# reached in turn through the service's front there (plan/refusals.py says where it may).
if PLAN.replicated:

    rule serve_replica:
        input:
            network=network_held,
            validated=FILES.inputs_summary,
            dependencies=service_dependencies,
            script=script("app_service.py"),
        output:
            service=service(FILES.replica_file("{service}", "{replica}")),
        log:
            "logs/serve_service/{run}/{service}-replica-{replica}.log",
        wildcard_constraints:
            replica=r"[0-9]+",
        retries: PLAN.retries
        group:
            "stack"
        conda:
            STACK_ENV
        threads: 0
        resources:
            cpus_per_task=service_cpus,
            gpu=service_gpus,
        params:
            launch=launch("replica"),
            args=args("replica"),
        shell:
            ": > {output.service}; exec {params.launch} {input.script} {params.args} > {log} 2>&1"

    rule await_replica:
        input:
            network=network_held,
            service=FILES.replica_file("{service}", "{replica}"),
            script=script("readiness.py"),
        output:
            FILES.replica_gate("{service}", "{replica}"),
        log:
            "logs/await_service/{run}/{service}-replica-{replica}.log",
        wildcard_constraints:
            replica=r"[0-9]+",
        retries: PLAN.retries
        group:
            "stack"
        conda:
            STACK_ENV
        threads: 0
        params:
            launch=launch("replica_gate"),
            args=args("replica_gate"),
        shell:
            "exec {params.launch} {input.script} {params.args} > {log} 2>&1"
