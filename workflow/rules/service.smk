# Stage 1b (only with config service.command): your own long-running service
# (Compose: another service the workers depend on), run like the coordinator -
# a service job on loopback with a published endpoint and token - and its own
# readiness gate. Workers consume it too, so it lives until they are done.
# Its service file is created first thing, as the coordinator's is (coordinator.smk).


if config["service"]["command"]:

    rule serve_app:
        input:
            validated="results/{run}/inputs.json",
            script=script("app_service.py"),
        output:
            service=service("results/{run}/app.service"),
        log:
            "logs/serve_app/{run}.log",
        group:
            "stack"
        conda:
            STACK_ENV
        threads: 0
        params:
            launch=launch("app"),
            command=command_option(config["service"]["command"]),
        shell:
            ": > {output.service}; exec {params.launch} {input.script} --service-file {output.service} "
            "{params.command} > {log} 2>&1"

    rule await_app_readiness:
        input:
            service="results/{run}/app.service",
            script=script("readiness.py"),
        output:
            "results/{run}/app-readiness.json",
        log:
            "logs/await_app_readiness/{run}.log",
        group:
            "stack"
        conda:
            STACK_ENV
        threads: 0
        params:
            launch=launch("app-readiness"),
            timeout=config["readiness"]["timeout"],
            interval=config["readiness"]["interval"],
            mode=app_readiness_options(),
        shell:
            "exec {params.launch} {input.script} --endpoint-name app.json "
            "{params.mode} --timeout {params.timeout} --interval {params.interval} "
            "--record {output} > {log} 2>&1"
