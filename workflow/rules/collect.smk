# Stage 4: collection. After the stack ended: merge the event log from scratch,
# draw the run's timeline from it (shown by `snakemake --report`), record where every
# component ran and how each of your services ended (their supervisors' end records:
# Snakemake never checks a service's exit status), and remove the job-scoped scratch.


rule collect_results:
    input:
        unpack(coordinator_outputs),
        validated=FILES.inputs_summary,
        service_gates=service_gates,
        workers=worker_records,
        main=main_records,
        check=check_records,
        served=PLAN.served_records("{run}"),
        node_gates=node_gates,
        stack_job=FILES.stack_job,
        script=script("collect.py"),
    output:
        events=FILES.events,
        provenance=FILES.provenance,
        services=FILES.services_record,
        timeline=report(
            FILES.timeline,
            caption="../report/timeline.rst",
            category="Timeline",
        ),
    log:
        "logs/collect_results/{run}.log",
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
        python=PLAN.python,
        args=args("collect"),
    shell:
        "{params.python} {input.script} {params.args} > {log} 2>&1"
