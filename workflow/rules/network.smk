# Stage 2b (only with config nodes above 1): the readiness gate of each other node. The
# coordinator runs on the first node and also listens on that node's network address
# (config network.*); on every other node, one job step checks that the coordinator is
# reachable from there, over TLS with the run's pinned certificate, and answers /health
# with the right taskCount. Its record is the sentinel for that node's workers, and its
# gate-passed event (with that node's clock) precedes every worker start there.
# A wrong or unreachable address fails here, with one [network] line, before any worker
# on that node starts.


if NODES > 1:

    rule await_network:
        input:
            service="results/{run}/coordinator.service",
            validated="results/{run}/inputs.json",
            script=script("readiness.py"),
        output:
            "results/{run}/gates/node-{node}.json",
        log:
            "logs/await_network/{run}/node-{node}.log",
        group:
            "stack"
        conda:
            STACK_ENV
        threads: 0
        params:
            # A node lost before its gate passed: recorded (not "ready"), its workers never
            # start, the other nodes do the work.
            launch=launch(
                "gate-node-{wildcards.node}",
                node=gate_node,
                tolerate_kill="results/{wildcards.run}/gates/node-{wildcards.node}.json",
            ),
            endpoint=shared_endpoint,
            events=node_gate_events,
            coordinator_record="results/{run}/coordinator.json",
            timeout=config["readiness"]["timeout"],
            interval=config["readiness"]["interval"],
        shell:
            "exec {params.launch} {input.script} --off-node --inputs-summary {input.validated} "
            "--endpoint-file {params.endpoint:q} --events {params.events:q} "
            "--timeout {params.timeout} --interval {params.interval} "
            "--record {output} --coordinator-record {params.coordinator_record} > {log} 2>&1"
