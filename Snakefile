# allocstack: a Compose-style stack (coordinator service + workers + verifier)
# inside ONE allocation. Read README.md first; the DAG is readable from the
# include lines below, one file per stage.
from snakemake.utils import min_version

min_version("9.27")


configfile: "config/config.yaml"


# common.smk makes the plan first (workflow/scripts/allocstack/plan/): the config validated
# against workflow/schemas/config.schema.yaml, every decision made, or ONE line and an exit.
include: "workflow/rules/common.smk"
include: "workflow/rules/inputs.smk"
include: "workflow/rules/coordinator.smk"
include: "workflow/rules/readiness.smk"
include: "workflow/rules/network.smk"
include: "workflow/rules/init.smk"
include: "workflow/rules/service.smk"
include: "workflow/rules/stack_job.smk"
include: "workflow/rules/workers.smk"
include: "workflow/rules/main.smk"
include: "workflow/rules/serve.smk"
include: "workflow/rules/check.smk"
include: "workflow/rules/collect.smk"
include: "workflow/rules/verify.smk"


rule all:
    default_target: True
    input:
        PLAN.verdict(PLAN.run),
        PLAN.layout.decision_record,
        PLAN.layout.timeline,
    localrule: True


# A run (not a dry run) starts: what cannot run here is one line (more than one node outside Slurm);
# `--forcerun serve_coordinator` starts it over, with a fresh journal.
onstart:
    refuse_what_cannot_run()
    start_of_run()


# The verdict, counts, wall time and where the marker and report are, on the terminal.
onsuccess:
    end_of_run_summary("success")


onerror:
    end_of_run_summary("error")
