# Review and report: the decision record (config `decisions`, the seed's "Adapt
# it" exercise; written once the inputs are validated) and the run's timeline,
# both shown by `snakemake --report`.


rule record_decisions:
    input:
        # After validation: bad inputs write nothing, not even the decision record.
        validated="results/{run}/inputs.json",
        script=script("render_decisions.py"),
    output:
        report(
            "results/{run}/decision-record.md",
            caption="../report/decision-record.rst",
            category="Decision record",
        ),
    log:
        "logs/record_decisions/{run}.log",
    localrule: True
    conda:
        STACK_ENV
    params:
        python=PYTHON,
        decisions=json.dumps(config["decisions"]),
        facts=decision_facts,
    message:
        decision_summary()
    shell:
        "{params.python} {input.script} --run {wildcards.run} --decisions-json {params.decisions:q} "
        "--facts-json {params.facts:q} --output {output} > {log} 2>&1"


rule plot_timeline:
    input:
        events="results/{run}/events.jsonl",
        script=script("plot_timeline.py"),
    output:
        report(
            "results/{run}/timeline.svg",
            caption="../report/timeline.rst",
            category="Timeline",
        ),
    log:
        "logs/plot_timeline/{run}.log",
    localrule: True
    conda:
        STACK_ENV
    params:
        python=PYTHON,
    shell:
        "{params.python} {input.script} --events {input.events} --output {output} > {log} 2>&1"
