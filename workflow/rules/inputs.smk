# Stage 0: validate the inputs (and the image's digest) before anything starts.
# A local rule: it runs where Snakemake runs (the login node), in seconds.


rule validate_inputs:
    input:
        tasks=tasks_input,
        expected=expected_input,
        script=script("validate_inputs.py"),
    output:
        "results/{run}/inputs.json",
    log:
        "logs/validate_inputs/{run}.log",
    localrule: True
    conda:
        STACK_ENV
    params:
        expected=expected_option,
        python=PYTHON,
        image=(
            f"--image {shlex.quote(config['image'])} --runtime {RUNTIME}"
            if USE_IMAGE
            else ""
        ),
        workers=config["workers"],
        handler=(
            "long-running"
            if LONG_RUNNING
            else ("command" if config["worker"]["command"] else "baseline")
        ),
        tasks=tasks_option,
    shell:
        "{params.python} {input.script} {params.tasks} {params.expected} "
        "--workers {params.workers} --handler {params.handler} {params.image} "
        "--output {output} > {log} 2>&1"
