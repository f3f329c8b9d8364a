# Stage 3b: the stack's main program (config `main`, Compose's `--exit-code-from NAME`): a
# service of yours that runs ONCE, beside the workers, as soon as its depends_on passed their
# gates (a producer that queues the work and waits for it). The stack ends when it ends: its
# exit code decides the run; exit 0 tells the workers to stop (SIGTERM, their grace, SIGKILL),
# then the check runs while the services are still up. It consumes the services' files, so
# they stay up while it runs.


rule run_main:
    input:
        network=network_held,
        services=main_inputs,
        script=script("main.py"),
    output:
        FILES.main_record,
    log:
        "logs/run_main/{run}.log",
    retries: PLAN.retries
    group:
        "stack"
    conda:
        STACK_ENV
    threads: 0
    resources:
        cpus_per_task=main_cpus,
        gpu=PLAN.main_gpus,
    params:
        launch=launch("main"),
        args=args("main"),
    shell:
        "exec {params.launch} {input.script} {params.args} > {log} 2>&1"
