# Stage 3c (config mode: serve): a serving stack. Your services alone (and main, if set), no
# workers, no check. serve.py waits for every gate, then the stack is "up": it says so on
# the terminal and in results/<run>/up.json, with the SSH tunnel line of each service's port.
# It consumes every service's file, so they stay up until it ends: at the allocation's time
# limit, on scancel, Ctrl-C, or when main ends. An end after "up" is a success: it writes
# the marker (result.json, "ended by scancel after N s up") itself, since after a scancel or
# the time limit nothing else of the job runs. Its stdout is Snakemake's output.

if PLAN.serving:

    rule serve_stack:
        input:
            services=PLAN.serve_inputs("{run}"),
            script=script("serve.py"),
        output:
            FILES.served_record,
        log:
            "logs/serve_stack/{run}.log",
        retries: PLAN.retries
        group:
            "stack"
        conda:
            STACK_ENV
        threads: 0
        resources:
            runtime=0,
        params:
            launch=launch("serve"),
            args=args("serve"),
        shell:
            "exec {params.launch} {input.script} {params.args} 2> {log}"
