# Stage 3: the workers (Compose: `worker` with deploy.replicas). One job, and
# inside Slurm one job step, per worker. Each consumes the coordinator's service
# output, which keeps the coordinator alive until the last worker is done.


rule run_worker:
    input:
        service="results/{run}/coordinator.service",
        gate="results/{run}/readiness.json",
        script=script("worker.py"),
    output:
        "results/{run}/workers/{worker}.json",
    log:
        "logs/run_worker/{run}/{worker}.log",
    params:
        launch=launch("worker"),
        batch=config["worker"]["batch"],
        wait=config["worker"]["wait_timeout"],
        connect=config["worker"]["connect_timeout"],
        lease=config["coordinator"]["lease_seconds"],
        simulate=config["simulate"]["task_seconds"],
    group:
        "stack"
    threads: 1
    shell:
        "exec {params.launch} {input.script} --worker-id {wildcards.worker} "
        "--gate-record {input.gate} --record {output} --batch {params.batch} "
        "--wait-timeout {params.wait} --connect-timeout {params.connect} "
        "--lease-seconds {params.lease} --simulate-seconds {params.simulate} "
        "> {log} 2>&1"
