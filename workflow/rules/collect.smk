# Stage 4: collection. After the stack ended: merge the event log from scratch,
# draw the run's timeline from it (shown by `snakemake --report`), record where every
# component ran and how each of your services ended (their supervisors' end records:
# Snakemake never checks a service's exit status), and remove the job-scoped scratch.


rule collect_results:
    input:
        unpack(coordinator_outputs),
        validated="results/{run}/inputs.json",
        service_gates=expand(service_gate("{service}"), service=SERVICES),
        workers=worker_records,
        check=check_record,
        node_gates=node_gate_records,
        script=script("collect.py"),
    output:
        events="results/{run}/events.jsonl",
        provenance="results/{run}/provenance.json",
        services="results/{run}/services.json",
        timeline=report(
            "results/{run}/timeline.svg",
            caption="../report/timeline.rst",
            category="Timeline",
        ),
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
        options=collect_options,
        shared=shared_dir,
    shell:
        "{params.python} {input.script} --scratch-root={params.scratch:q} --run {wildcards.run} "
        "--inputs-summary {input.validated} --shared-dir {params.shared:q} --events-out {output.events} "
        "--provenance-out {output.provenance} --services-out {output.services} --timeline-out {output.timeline} "
        "{params.options} > {log} 2>&1"
