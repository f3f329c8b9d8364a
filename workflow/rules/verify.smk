# Stage 5: verification (Compose: the one-shot `verify` service). The only
# artifact that says a run succeeded is result.json with status "success",
# written atomically after every check passed.


rule verify_results:
    input:
        tasks=config["tasks"],
        expected=expected_input,
        results="results/{run}/results.json",
        end_record="results/{run}/coordinator.json",
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
        launch=launch("verify", scratch=False),
        expected=expected_option,
        command=command_option(config["verify"]["command"]),
        journal=journal_path,
    shell:
        "{params.launch} {input.script} --input {input.tasks:q} {params.expected} {params.command} "
        "--results {input.results} --end-record {input.end_record} --events {input.events} "
        "--output {output} --retire-journal {params.journal:q} > {log} 2>&1"
