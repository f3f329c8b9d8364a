# Stage 2: the readiness gate (Compose: depends_on + healthcheck). It passes
# only when the coordinator answers /health with the expected taskCount, and
# writes the gate record every worker waits for.


rule await_readiness:
    input:
        service="results/{run}/coordinator.service",
        validated="results/{run}/inputs.json",
        script=script("readiness.py"),
    output:
        "results/{run}/readiness.json",
    log:
        "logs/await_readiness/{run}.log",
    group:
        "stack"
    conda:
        STACK_ENV
    threads: 0
    params:
        launch=launch("readiness"),
        coordinator_record="results/{run}/coordinator.json",
        timeout=config["readiness"]["timeout"],
        interval=config["readiness"]["interval"],
    shell:
        "exec {params.launch} {input.script} --inputs-summary {input.validated} "
        "--timeout {params.timeout} --interval {params.interval} "
        "--record {output} --coordinator-record {params.coordinator_record} > {log} 2>&1"
