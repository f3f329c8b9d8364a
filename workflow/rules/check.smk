# Stage 3b (your own stack, tasks: null): your check (Compose: the one-shot
# service that waits for the workers with service_completed_successfully). It
# consumes your services' files, so they stay up while it runs, and waits for
# every worker's record itself (a Snakemake input would be polled once a second,
# and time out after --latency-wait): it runs once the last worker ended.


rule run_check:
    input:
        network=network_held,
        services=check_inputs,
        script=script("check.py"),
    output:
        FILES.check_record,
    log:
        "logs/run_check/{run}.log",
    retries: PLAN.retries
    group:
        "stack"
    conda:
        STACK_ENV
    threads: 0
    resources:
        # Seconds of work inside the stack's job: add nothing to its time limit
        # (Snakemake sums runtime over a group's sequential stages).
        runtime=0,
    params:
        launch=launch("check"),
        args=args("check"),
    shell:
        "exec {params.launch} {input.script} {params.args} > {log} 2>&1"
