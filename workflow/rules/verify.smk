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
        validated="results/{run}/inputs.json",
        check=check_record,
        services="results/{run}/services.json",
        events="results/{run}/events.jsonl",
        script=script("verify.py"),
    output:
        "results/{run}/result.json",
    log:
        "logs/verify_results/{run}.log",
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
        launch=launch(
            "verify", scratch=VOLUMES_AFTER_COLLECT, one_shot=True, beside=check_beside
        ),
        options=verify_options,
        journal=journal_path,
        scratch="--remove-scratch" if VOLUMES_AFTER_COLLECT else "",
    shell:
        "{params.launch} {input.script} {params.options} "
        "--output {output} --retire-journal {params.journal:q} {params.scratch} > {log} 2>&1"
