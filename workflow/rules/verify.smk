# Stage 5: verification (Compose: the one-shot `verify` service). The only
# artifact that says a run succeeded is result.json with status "success",
# written atomically after every check passed: the coordinator's results (with
# config tasks) or your check's record (run_check), and how each of your
# services ended.


rule verify_results:
    input:
        unpack(coordinator_outputs),
        tasks=tasks_input,
        expected=expected_input,
        validated=FILES.inputs_summary,
        check=check_records,
        served=PLAN.served_records("{run}"),
        services=FILES.services_record,
        events=FILES.events,
        script=script("verify.py"),
    output:
        # The marker (result.json); in serve mode verification's own record, beside the marker it writes.
        PLAN.verdict("{run}"),
    log:
        "logs/verify_results/{run}.log",
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
        launch=launch("verify"),
        args=args("verify"),
    shell:
        "{params.launch} {input.script} {params.args} > {log} 2>&1"
