# Stage 1b (config `services`, or the single `service:` block as `app`): your own
# long-running services (Compose: each service the workers use), run like the
# coordinator - a service job on loopback with a published endpoint and token -
# each with its own readiness gate. A service starts after the gates of its
# depends_on passed (their gate records are its sentinels) and consumes their
# service files; the workers (and your check) consume every service file, so
# all of them live until those are done. Snakemake never checks a service's
# exit status: its supervisor records how it ended, and verification checks it.
# Its service file is created first thing, as the coordinator's is (coordinator.smk).
# With config nodes above 1 every service runs on the first node, on its loopback as
# with one node, and is relayed to the other nodes over TLS (allocstack/launch/tunnel.py).


rule serve_service:
    input:
        validated=FILES.inputs_summary,
        dependencies=service_dependencies,
        script=script("app_service.py"),
    output:
        service=service(FILES.service_file("{service}")),
    log:
        "logs/serve_service/{run}/{service}.log",
    group:
        "stack"
    conda:
        STACK_ENV
    threads: 0
    resources:
        cpus_per_task=service_cpus,
        gpu=service_gpus,
    params:
        launch=launch("service"),
        # With more than one node: relayed over TLS to the first node's network address too.
        args=args("service"),
    shell:
        ": > {output.service}; exec {params.launch} {input.script} {params.args} > {log} 2>&1"


rule await_service:
    input:
        service=FILES.service_file("{service}"),
        script=script("readiness.py"),
    output:
        FILES.service_gate("{service}"),
    log:
        "logs/await_service/{run}/{service}.log",
    group:
        "stack"
    conda:
        STACK_ENV
    threads: 0
    params:
        launch=launch("service_gate"),
        args=args("service_gate"),
    shell:
        "exec {params.launch} {input.script} {params.args} > {log} 2>&1"
