"""allocstack.common.slurm: Slurm's answers parsed from captured output, and the pre-submission check."""

from __future__ import annotations

import sys

import pytest

from allocstack.common import slurm
from allocstack.common.slurm import ClusterFacts, Submission

# Captured on the test cluster (Slurm 22.05.8): `scontrol --oneliner show partition`.
PARTITIONS = (
    "PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES QoS=N/A "
    "DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED "
    "MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=vm PriorityJobFactor=1 PriorityTier=1 "
    "RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF State=UP TotalCPUs=8 "
    "TotalNodes=1 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED "
    "TRES=cpu=8,mem=8000M,node=1,billing=8\n"
    "PartitionName=short AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=NO QoS=N/A "
    "DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED "
    "MaxTime=00:05:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=vm PriorityJobFactor=1 PriorityTier=1 "
    "RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF State=UP TotalCPUs=8 "
    "TotalNodes=1 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED "
    "TRES=cpu=8,mem=8000M,node=1,billing=8\n"
    "PartitionName=big AllowGroups=ALL Default=NO MaxTime=2-00:00:00 Nodes=n[1-2] State=UP "
    "MaxMemPerNode=64000\n"
)
# `scontrol --oneliner show node`: the OS value has spaces in it.
NODES = (
    "NodeName=vm Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=0.65 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=vm "
    "Version=22.05.8 OS=Linux 6.18.44-fc-v1147 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=8000 AllocMem=0 "
    "FreeMem=22016 Sockets=8 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "Partitions=debug,short  BootTime=2026-12-03T02:29:12 SlurmdStartTime=2026-12-03T03:45:24 "
    "CfgTRES=cpu=8,mem=8000M,billing=8 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0\n"
    "NodeName=n1 CPUTot=64 RealMemory=128000 Partitions=big State=IDLE\n"
    "NodeName=n2 CPUTot=64 RealMemory=96000 Partitions=big State=IDLE\n"
)
# `sacctmgr --noheader --parsable2 show account format=account` and `... show association user=root`.
ACCOUNTS = "allocstack\nallocstack-other\nroot\n"
ASSOCIATIONS = "allocstack\nroot\nallocstack\n"


def facts(**overrides) -> ClusterFacts:
    found = ClusterFacts(accounts=slurm.parse_column(ACCOUNTS), user_accounts=slurm.parse_column(ASSOCIATIONS),
                         partitions=slurm.parse_partitions(PARTITIONS), nodes=slurm.parse_nodes(NODES))
    for key, value in overrides.items():
        setattr(found, key, value)
    return found


def ask(account="allocstack", partition="debug", runtime=10, memory=1200, user="root") -> Submission:
    return Submission(account=account, partition=partition, runtime=runtime, memory=memory, user=user)


@pytest.mark.parametrize("text, minutes", [
    ("UNLIMITED", None), ("INFINITE", None), ("5", 5), ("00:05:00", 5), ("30:30", 31), ("1:00:01", 61),
    ("1-00:00:00", 1440), ("2-12", 3600), ("1-02:03", 1563),
])
def test_slurm_times_in_minutes(text, minutes):
    assert slurm.parse_minutes(text) == minutes


@pytest.mark.parametrize("text", ["soon", "1h", "-5", "1:2:3:4"])
def test_a_time_slurm_does_not_write_is_an_error(text):
    with pytest.raises(ValueError):
        slurm.parse_minutes(text)


@pytest.mark.parametrize("text, megabytes", [("8000", 8000), ("8000M", 8000), ("8G", 8192), ("1T", 1048576),
                                             ("UNLIMITED", None)])
def test_slurm_memory_in_megabytes(text, megabytes):
    assert slurm.parse_megabytes(text) == megabytes


def test_a_record_value_may_contain_spaces():
    record = slurm.parse_record(NODES.splitlines()[0])
    assert record["OS"] == "Linux 6.18.44-fc-v1147 #1 SMP PREEMPT_DYNAMIC @0"
    assert record["RealMemory"] == "8000" and record["Partitions"] == "debug,short"
    assert record["CfgTRES"] == "cpu=8,mem=8000M,billing=8"


def test_partitions_and_nodes_from_captured_output():
    partitions = slurm.parse_partitions(PARTITIONS)
    assert list(partitions) == ["debug", "short", "big"]
    assert partitions["debug"].max_time is None and partitions["debug"].default
    assert partitions["short"].max_time == 5 and not partitions["short"].default
    assert partitions["big"].max_time == 2880 and partitions["big"].max_mem_per_node == 64000
    nodes = slurm.parse_nodes(NODES)
    assert nodes["vm"] == slurm.Node("vm", 8000, 8, ("debug", "short"))
    assert nodes["n1"].real_memory == 128000


def test_accounts_column_keeps_order_and_drops_duplicates():
    assert slurm.parse_column(ASSOCIATIONS) == ["allocstack", "root"]
    assert slurm.parse_column("a|x\n\n b |y\n") == ["a", "b"]


def test_settings_slurm_accepts_pass():
    assert slurm.submission_problem(ask(), facts()) is None
    assert slurm.submission_problem(ask(partition="short", runtime=5), facts()) is None


@pytest.mark.parametrize("submission, key, words", [
    (ask(account="nope"), "slurm_account", "slurm_account=nope: there is no such account"),
    (ask(account="allocstack-other"), "slurm_account", "user root has no association with it"),
    (ask(partition="nope"), "slurm_partition", "no such partition (partitions: debug, short, big)"),
    (ask(partition="short", runtime=10), "runtime", "runtime=10: above the 5-minute MaxTime of partition short"),
    (ask(memory=12000), "mem_mb", "above the 8000 MB of the largest node of partition debug"),
    (ask(partition="big", runtime=60, memory=100000), "mem_mb", "above the 64000 MB"),  # MaxMemPerNode
])
def test_each_refused_setting_names_its_key(submission, key, words):
    found, message = slurm.submission_problem(submission, facts())
    assert found == key and words in message, message
    assert "\n" not in message


def test_the_first_problem_is_reported():
    both = ask(account="nope", partition="nope")
    assert slurm.submission_problem(both, facts())[0] == "slurm_account"


def test_without_a_partition_the_default_partitions_limits_apply():
    assert slurm.submission_problem(ask(partition=None, memory=12000), facts())[0] == "mem_mb"
    no_default = {name: p for name, p in slurm.parse_partitions(PARTITIONS).items() if not p.default}
    assert slurm.submission_problem(ask(partition=None, memory=12000), facts(partitions=no_default)) is None


def test_what_slurm_could_not_answer_is_not_checked():
    unknown = ClusterFacts()
    for submission in (ask(account="nope"), ask(partition="nope"), ask(memory=10**9)):
        assert slurm.submission_problem(submission, unknown) is None
    # Accounts known, associations not: an existing account passes.
    assert slurm.submission_problem(ask(account="allocstack-other"), facts(user_accounts=None)) is None


def test_gather_facts_asks_only_what_it_checks():
    asked: list[list[str]] = []
    answers = {"account": ACCOUNTS, "association": ASSOCIATIONS, "partition": PARTITIONS, "node": NODES}

    def fake(argv: list[str]) -> str | None:
        asked.append(argv)
        return next(text for word, text in answers.items() if word in argv)

    found = slurm.gather_facts(ask(), fake)
    assert found.accounts == ["allocstack", "allocstack-other", "root"] and found.nodes["vm"].cpus == 8
    assert ["sacctmgr", "--noheader", "--parsable2", "show", "association", "user=root", "format=account"] in asked
    asked.clear()
    found = slurm.gather_facts(Submission(account=None, partition=None, runtime=None, memory=None), fake)
    assert asked == [] and found == ClusterFacts()
    assert slurm.gather_facts(ask(), lambda argv: None) == ClusterFacts()


def test_query_answers_none_when_slurm_cannot_answer():
    assert slurm.query([sys.executable, "-c", "print('ok')"]) == "ok\n"
    assert slurm.query(["allocstack-no-such-program"]) is None
    assert slurm.query([sys.executable, "-c", "raise SystemExit(1)"]) is None
    assert slurm.query([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.2) is None


@pytest.mark.parametrize("resources, expected", [
    ({"slurm_account": "'allocstack'", "slurm_partition": "debug", "runtime": 15, "mem_mb": 500},
     Submission("allocstack", "debug", 15, 2000, "mem_mb=500 x 4 components running at once = 2000", "u", "15")),
    ({"runtime": "1.5h", "mem_mb_per_cpu": "100"},
     Submission(None, None, 90, 300, "mem_mb_per_cpu=100 x 3 CPUs = 300", "u", "1.5h")),
    ({"runtime": "attempt * 60", "mem_mb": "2 * 1000"}, Submission(None, None, None, None, "", "u", "attempt * 60")),
])
def test_the_stack_jobs_request_from_default_resources(resources, expected):
    assert slurm.submission_from_resources(resources, components=4, cpus=3, user="u") == expected


@pytest.mark.parametrize("text, minutes", [("90", 90), ("90m", 90), ("1.5h", 90), ("2d", 2880), ("30s", 0)])
def test_snakemake_runtimes_in_minutes(text, minutes):
    assert slurm.parse_runtime(text) == minutes


def test_an_allocations_nodes_come_from_scontrol():
    asked = []

    def fake(argv):
        asked.append(argv)
        return "node01\nnode02\n"

    assert slurm.allocation_nodes("node[01-02]", fake) == ["node01", "node02"]
    assert asked == [["scontrol", "show", "hostnames", "node[01-02]"]]
    assert slurm.allocation_nodes("", fake) is None and len(asked) == 1
    assert slurm.allocation_nodes("node01", lambda argv: None) is None
