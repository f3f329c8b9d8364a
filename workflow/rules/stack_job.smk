# Stage 2c: the stack's group of jobs has started. open_stack consumes every service of the
# stack, so Snakemake starts it together with them, records where (node, Slurm job, the CPUs
# Snakemake sees there) and ends at once. Ending at once is its purpose: Snakemake runs such a
# group on a pool of threads one short when the group is as large as the pool (the group's own
# runner holds a thread), and the job left waiting could be the gate every worker waits for
# (workflow/scripts/stack_job.py). collect_results copies the record into provenance.json.


rule open_stack:
    input:
        services=stack_services,
        script=script("stack_job.py"),
    output:
        FILES.stack_job,
    log:
        "logs/open_stack/{run}.log",
    retries: PLAN.retries
    group:
        "stack"
    conda:
        STACK_ENV
    threads: 0
    resources:
        runtime=0,
    params:
        python=PLAN.python,
    shell:
        "{params.python} {input.script} --out {output} > {log} 2>&1"
