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
        tasks=tasks_input,
        validated="results/{run}/inputs.json",
        compact=COMPACT_TASKS,
        script=script("coordinator.py"),
    output:
        service=service("results/{run}/coordinator.service"),
        results="results/{run}/results.json",
        end_record="results/{run}/coordinator.json",
    log:
        "logs/serve_coordinator/{run}.log",
    group:
        "stack"
    conda:
        STACK_ENV
    threads: 0
    resources:
        **stack_resources(),
    params:
        launch=launch(
            "coordinator",
            config["coordinator"]["cpus"],
            job_end_time=config["coordinator"]["stop_claims_before_end"],
        ),
        journal=journal_path,
        network=network_options(NAMES.ENDPOINT),
        lease=config["coordinator"]["lease_seconds"],
        workers=config["workers"],
        attempts=config["coordinator"]["max_attempts"],
        idle=config["coordinator"]["idle_timeout"],
        lifetime=config["coordinator"]["lifetime"],
        stop_claims=(
            ""
            if config["coordinator"]["stop_claims_before_end"]
            else "--stop-claims-at 0"
        ),
    shell:
        ": > {output.service}; exec {params.launch} {input.script} --input {input.tasks:q} "
        "--results {output.results} --end-record {output.end_record} --inputs-summary {input.validated} "
        "--compact-tasks {input.compact} "
        "--service-file {output.service} --journal {params.journal:q} "
        "--workers {params.workers} --max-attempts {params.attempts} --lease-seconds {params.lease} --idle-timeout {params.idle} "
        "--lifetime {params.lifetime} {params.stop_claims} {params.network} 2> {log}"
