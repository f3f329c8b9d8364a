# Stage 3: the workers (Compose: `worker` with deploy.replicas). One job, and
# inside Slurm one job step, per worker. Each consumes the coordinator's service
# output (and your services'), which keeps them alive until the last worker is done.
# worker.mode per-task (the default): worker.py claims tasks from the coordinator;
# long-running: replica.py runs your worker.command once for the stack's life.
#
# The gate record is the sentinel between the gate and the workers. It is not a
# Snakemake input on purpose: Snakemake polls for missing inputs once a second,
# while the worker waits for it itself every 20 ms (bounded), so the first task
# is claimed within milliseconds of the gate passing. verify_results checks in
# events.jsonl that the gate passed before every worker started.
#
# With config nodes above 1 the workers are spread over the nodes (worker_node: balanced
# blocks), each a job step pinned to its node; off the first node a worker also waits for
# its node's gate (network.smk) and reads the endpoint published for the other nodes.


rule run_worker:
    input:
        services=worker_inputs,
        script=script("replica.py" if LONG_RUNNING else "worker.py"),
    output:
        "results/{run}/workers/{worker}.json",
    log:
        "logs/run_worker/{run}/{worker}.log",
    group:
        "stack"
    conda:
        STACK_ENV
    threads: 0
    resources:
        # With more than one node the coordinator's job carries the CPUs per node.
        cpus_per_task=config["worker"]["cpus"] if NODES == 1 else 0,
        gpu=config["worker"]["gpus"],
    params:
        # A per-task worker killed from outside is tolerated (its tasks go back to the
        # queue); a long-running one is not: the run fails.
        launch=launch(
            "{wildcards.worker}",
            config["worker"]["cpus"],
            tolerate_kill=(
                None
                if LONG_RUNNING
                else "results/{wildcards.run}/workers/{wildcards.worker}.json"
            ),
            node=worker_node,
            beside=worker_beside,
            image=worker_image,
        ),
        network=worker_network_options,
        gates=gate_records,
        gate_timeout=gates_timeout(),
        options=worker_options,
    shell:
        "exec {params.launch} {input.script} --worker-id {wildcards.worker} "
        "{params.gates} --gate-timeout {params.gate_timeout} --record {output} {params.options} {params.network} "
        "> {log} 2>&1"
