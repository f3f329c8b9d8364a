# Stage 0: validate the inputs (and the image's digest) before anything starts, then
# write the decision record (config `decisions`, the seed's "Adapt it" exercise, shown by
# `snakemake --report`; its owners are on one line in --dry-run): bad inputs write nothing,
# not even the record. A local rule: it runs where Snakemake runs (the login node), in
# seconds; one job, one interpreter, done before the stack's components start. With a task
# document it also writes the validated task set compactly (tasks.compact), which the
# coordinator loads instead of decoding the document again.


rule validate_inputs:
    input:
        tasks=tasks_input,
        expected=expected_input,
        script=script("validate_inputs.py"),
    output:
        **compact_tasks_output(),
        summary="results/{run}/inputs.json",
        decisions=report(
            "results/{run}/decision-record.md",
            caption="../report/decision-record.rst",
            category="Decision record",
        ),
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
            else f"--runtime {RUNTIME}"
        ),
        workers=config["workers"],
        handler=(
            "long-running"
            if LONG_RUNNING
            else ("command" if config["worker"]["command"] else "baseline")
        ),
        tasks=tasks_option,
        compact=compact_tasks_option,
        decisions=json.dumps(config["decisions"]),
        images=image_checks,
        facts=decision_facts,
    message:
        f"validate_inputs: the inputs, then the decision record ({decision_summary()})"
    shell:
        "{params.python} {input.script} {params.tasks} {params.compact} {params.expected} "
        "--workers {params.workers} --handler {params.handler} {params.image} "
        "--output {output.summary} --run {wildcards.run} --decisions-json {params.decisions:q} "
        "--facts-json {params.facts:q} --program-images-json {params.images:q} "
        "--decision-record {output.decisions} > {log} 2>&1"
