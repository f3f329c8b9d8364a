# Stage 3: the workers (Compose: `worker` with deploy.replicas). One job, and
# inside Slurm one job step, per worker. Each consumes the coordinator's service
# output, which keeps the coordinator alive until the last worker is done.
#
# The gate record is the sentinel between the gate and the workers. It is not a
# Snakemake input on purpose: Snakemake polls for missing inputs once a second,
# while the worker waits for it itself every 20 ms (bounded), so the first task
# is claimed within milliseconds of the gate passing. verify_results checks in
# events.jsonl that the gate passed before every worker started.


rule run_worker:
    input:
        service="results/{run}/coordinator.service",
        app=app_service_inputs,
        script=script("worker.py"),
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
        cpus_per_task=config["worker"]["cpus"],
        gpu=config["worker"]["gpus"],
    params:
        launch=launch(
            "{wildcards.worker}",
            config["worker"]["cpus"],
            tolerate_kill="results/{wildcards.run}/workers/{wildcards.worker}.json",
        ),
        gates=gate_records,
        gate_timeout=config["readiness"]["timeout"] + 30,
        batch=config["worker"]["batch"],
        wait=config["worker"]["wait_timeout"],
        connect=config["worker"]["connect_timeout"],
        lease=config["coordinator"]["lease_seconds"],
        simulate=config["simulate"]["task_seconds"],
        command=command_option(config["worker"]["command"]),
        task_timeout=config["worker"]["task_timeout"],
    shell:
        "exec {params.launch} {input.script} --worker-id {wildcards.worker} "
        "{params.gates} --gate-timeout {params.gate_timeout} --record {output} --batch {params.batch} "
        "--wait-timeout {params.wait} --connect-timeout {params.connect} "
        "--lease-seconds {params.lease} --simulate-seconds {params.simulate} "
        "--task-timeout {params.task_timeout} {params.command} "
        "> {log} 2>&1"
