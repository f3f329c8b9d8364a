# Stage 1: the coordinator, a long-running service (Compose: the `coordinator`
# service). Snakemake starts it together with its consumers (the gate and every
# worker) and sends it SIGTERM when they are all done; it then drains and writes
# results.json and its end record. A coordinator that crashed writes no end
# record, so the run fails (Snakemake never checks a service's exit status).
# Its log is stderr; progress lines also go to stdout, i.e. Snakemake's output.
# The shell creates the service file before anything else: Snakemake starts the
# consumers right after and re-checks a missing service file only once a second,
# while srun + Apptainer + Python take about that long to start the coordinator
# (which rewrites the file with its pid). The gate does the real wait.
# Only with a task document (config tasks): without one, nothing asks for it.
# It runs on the allocation's first node; with config nodes above 1 it also listens on
# that node's network address for the workers on the other nodes (network.smk), and its
# job carries the whole allocation's shape (nodes, tasks, CPUs per node).


rule serve_coordinator:
    input:
        network=network_held,
        tasks=tasks_input,
        validated=FILES.inputs_summary,
        compact=FILES.compact_tasks,
        script=script("coordinator.py"),
    output:
        service=service(FILES.coordinator_service),
        results=FILES.coordinator_results,
        end_record=FILES.coordinator_end,
    log:
        "logs/serve_coordinator/{run}.log",
    retries: PLAN.retries
    group:
        "stack"
    conda:
        STACK_ENV
    threads: 0
    resources:
        **PLAN.shape.coordinator_resources(),
    params:
        launch=launch("coordinator"),
        args=args("coordinator"),
    shell:
        ": > {output.service}; exec {params.launch} {input.script} {params.args} 2> {log}"
