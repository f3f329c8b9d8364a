# Stage 2: the readiness gate (Compose: depends_on + healthcheck). It passes
# only when the coordinator answers /health with the expected taskCount, and
# writes the gate record every worker waits for.


rule await_readiness:
    input:
        network=network_held,
        service=FILES.coordinator_service,
        validated=FILES.inputs_summary,
        script=script("readiness.py"),
    output:
        FILES.coordinator_gate,
    log:
        "logs/await_readiness/{run}.log",
    retries: PLAN.retries
    group:
        "stack"
    conda:
        STACK_ENV
    threads: 0
    params:
        launch=launch("readiness"),
        args=args("readiness"),
    shell:
        "exec {params.launch} {input.script} {params.args} > {log} 2>&1"
