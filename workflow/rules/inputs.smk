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
        # What produces the results (the run's identity): a changed program or image reruns the stack.
        program=program_files,
        image=image_sidecar,
        script=script("validate_inputs.py"),
    output:
        **PLAN.validated_outputs("{run}"),
        summary=FILES.inputs_summary,
        decisions=report(
            FILES.decision_record,
            caption="../report/decision-record.rst",
            category="Decision record",
        ),
    log:
        "logs/validate_inputs/{run}.log",
    localrule: True
    conda:
        STACK_ENV
    params:
        python=PLAN.python,
        args=args("validate_inputs"),
    message:
        f"validate_inputs: the inputs, then the decision record ({PLAN.decision_summary})"
    shell:
        "{params.python} {input.script} {params.args} > {log} 2>&1"
