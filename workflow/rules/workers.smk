# Stage 3: the workers (Compose: `worker` with deploy.replicas). Each consumes the
# coordinator's service output (and your services'), which keeps them alive until the last
# worker is done. worker.mode per-task (the default): worker.py claims tasks from the
# coordinator; long-running: replica.py runs your worker.command once for the stack's life.
#
# The gate record is the sentinel between the gate and the workers. It is not a
# Snakemake input on purpose: Snakemake polls for missing inputs once a second,
# while the worker waits for it itself every 20 ms (bounded), so the first task
# is claimed within milliseconds of the gate passing. verify_results checks in
# events.jsonl that the gate passed before every worker started.
#
# With config nodes above 1 the workers are spread over the nodes (plan/placement.py: balanced
# blocks), each step pinned to its node; off the first node a worker also waits for its node's
# gate (network.smk) and reads the endpoint published for the other nodes.
#
# Up to 16 workers (the seed's shape, config worker.per_step 1): one job, and inside Slurm one
# job step, per worker (run_worker). Above (worker.per_step, by default one step per node): one
# job and one job step per block of a node's workers (run_workers), which runs them as processes
# it supervises (worker_block.py), each with its own id, record, log and leases, sharing a few
# connections to the coordinator; so the DAG and the job steps grow with the nodes, not the workers.

if PLAN.grouped:

    rule run_workers:
        input:
            network=network_held,
            services=worker_inputs,
            script=script("worker_block.py"),
            worker=script("worker.py"),
        output:
            directory(FILES.step_records("{step}")),
        log:
            FILES.step_log("{step}"),
        retries: PLAN.retries
        group:
            "stack"
        conda:
            STACK_ENV
        threads: 0
        resources:
            # With more than one node the coordinator's job carries the CPUs per node.
            cpus_per_task=step_cpus,
        params:
            # A step killed from outside, or its node lost, is tolerated: each of its workers without a
            # record is recorded killed and its tasks go back to the queue (plan/argv.py).
            launch=launch("workers"),
            args=args("workers"),
        shell:
            "exec {params.launch} {input.script} {params.args} > {log} 2>&1"

else:

    rule run_worker:
        input:
            network=network_held,
            services=worker_inputs,
            script=script(PLAN.script_of("worker")),
        output:
            FILES.worker_record("{worker}"),
        log:
            "logs/run_worker/{run}/{worker}.log",
        retries: PLAN.retries
        group:
            "stack"
        conda:
            STACK_ENV
        threads: 0
        resources:
            # With more than one node the coordinator's job carries the CPUs per node.
            cpus_per_task=PLAN.shape.worker_cpus,
            gpu=PLAN.config["worker"]["gpus"],
        params:
            # A per-task worker killed from outside is tolerated (its tasks go back to the queue); a
            # long-running one is not: the run fails (plan/argv.py).
            launch=launch("worker"),
            args=args("worker"),
        shell:
            "exec {params.launch} {input.script} {params.args} > {log} 2>&1"
