# Stage 4: collection. After the stack ended: merge the event log from scratch,
# record where every component ran, and remove the job-scoped scratch.


rule collect_results:
    input:
        validated="results/{run}/inputs.json",
        results="results/{run}/results.json",
        end_record="results/{run}/coordinator.json",
        gate="results/{run}/readiness.json",
        app_gate=app_gate_record,
        workers=expand("results/{{run}}/workers/{worker}.json", worker=WORKER_IDS),
        script=script("collect.py"),
    output:
        events="results/{run}/events.jsonl",
        provenance="results/{run}/provenance.json",
    log:
        "logs/collect_results/{run}.log",
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
        python=PYTHON,
        scratch=config["scratch"] or "",
    shell:
        "{params.python} {input.script} --scratch-root={params.scratch:q} --run {wildcards.run} "
        "--inputs-summary {input.validated} --events-out {output.events} "
        "--provenance-out {output.provenance} > {log} 2>&1"
