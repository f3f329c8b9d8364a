# Stage 2b (only with config nodes above 1): the readiness gate of each other node. The
# coordinator runs on the first node and also listens on that node's network address
# (config network.*); on every other node, one job step checks that the coordinator is
# reachable from there, over TLS with the run's pinned certificate, and answers /health
# with the right taskCount. Its record is the sentinel for that node's workers, and its
# gate-passed event (with that node's clock) precedes every worker start there.
# A wrong or unreachable address fails here, with one [network] line, before any worker
# on that node starts.


if PLAN.nodes > 1:

    rule await_network:
        input:
            service=FILES.coordinator_service,
            validated=FILES.inputs_summary,
            script=script("readiness.py"),
        output:
            FILES.node_gate("{node}"),
        log:
            "logs/await_network/{run}/node-{node}.log",
        retries: PLAN.retries
        group:
            "stack"
        conda:
            STACK_ENV
        threads: 0
        params:
            # A node lost before its gate passed: recorded (not "ready"), its workers never
            # start, the other nodes do the work.
            launch=launch("node_gate"),
            args=args("node_gate"),
        shell:
            "exec {params.launch} {input.script} {params.args} > {log} 2>&1"


# Stage 0 (config network.isolation: private): the stack's own network on each node, as
# Compose's network of a stack. A service job that every component on its node consumes:
# Snakemake keeps it up while any of them runs, then stops it. It makes a user + network
# namespace, gives it pasta as its way out, and publishes its holder in that node's scratch;
# launch.py starts every other component there in it (nsenter), so what they bind is
# reachable by the stack alone. On the first node of more than one, pasta forwards in only
# the listeners the other nodes use (TLS, and this run's keys: allocstack/launch/tunnel.py).


if PLAN.private_network:

    rule stack_network:
        input:
            script=script("stack_network.py"),
        output:
            network=service(FILES.stack_network),
        log:
            "logs/stack_network/{run}.log",
        retries: PLAN.retries
        group:
            "stack"
        conda:
            STACK_ENV
        threads: 0
        params:
            launch=launch("network"),
            args=args("network"),
        shell:
            ": > {output.network}; exec {params.launch} {input.script} {params.args} > {log} 2>&1"

    if PLAN.nodes > 1:

        rule node_network:
            input:
                script=script("stack_network.py"),
            output:
                network=service(FILES.node_network("{node}")),
            log:
                "logs/stack_network/{run}/node-{node}.log",
            retries: PLAN.retries
            group:
                "stack"
            conda:
                STACK_ENV
            threads: 0
            params:
                launch=launch("network"),
                args=args("network"),
            shell:
                ": > {output.network}; exec {params.launch} {input.script} {params.args} > {log} 2>&1"
