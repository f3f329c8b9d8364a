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
# with one node, and is relayed to the other nodes over TLS (allocstack/tunnel.py).


rule serve_service:
    input:
        validated="results/{run}/inputs.json",
        dependencies=service_dependencies,
        script=script("app_service.py"),
    output:
        service=service("results/{run}/services/{service}.service"),
    log:
        "logs/serve_service/{run}/{service}.log",
    group:
        "stack"
    conda:
        STACK_ENV
    threads: 0
    resources:
        cpus_per_task=service_cpus,
    params:
        launch=launch("{wildcards.service}", service_cpus, beside=service_beside),
        options=service_options,
        # With more than one node: relayed over TLS to the first node's network address too.
        network=network_options(NAMES.service_endpoint("{service}")),
    shell:
        ": > {output.service}; exec {params.launch} {input.script} --service-file {output.service} "
        "{params.options} {params.network} > {log} 2>&1"


rule await_service:
    input:
        service="results/{run}/services/{service}.service",
        script=script("readiness.py"),
    output:
        "results/{run}/services/{service}-readiness.json",
    log:
        "logs/await_service/{run}/{service}.log",
    group:
        "stack"
    conda:
        STACK_ENV
    threads: 0
    params:
        launch=launch("{wildcards.service}-readiness", beside=service_beside),
        options=service_gate_options,
    shell:
        "exec {params.launch} {input.script} {params.options} --record {output} > {log} 2>&1"
