# Stage 1a: init jobs (config init_jobs; Compose: a service others wait for with
# depends_on condition service_completed_successfully: a migration, a bucket's creation).
# Each runs ONCE, as a job step like a service, once its depends_on passed their gates,
# and must exit 0 within its readiness.timeout: its record is then the gate of what
# depends on it (services, main, and the workers, which wait for every init job). A
# non-zero exit fails this job, Snakemake stops the stack, and its dependents never
# start (one [init-exit] line names it, its exit code and its last line of stderr).
# It consumes the service files of its depends_on, so they stay up while it runs.


rule run_init:
    input:
        network=network_held,
        validated=FILES.inputs_summary,
        dependencies=service_dependencies,
        script=script("main.py"),
    output:
        FILES.init_record("{service}"),
    log:
        "logs/run_init/{run}/{service}.log",
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
        launch=launch("init"),
        args=args("init"),
    shell:
        "exec {params.launch} {input.script} {params.args} > {log} 2>&1"
