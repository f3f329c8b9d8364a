"""What the world says, in ONE value: the plan asks nothing itself.

The adapter (``workflow/rules/common.smk``) fills it from Snakemake and the process
(the deployment method, the profile's default resources, the environment, PATH, Slurm);
a test or ``import_compose.py`` gives the world it means. Every default is the empty
world: nothing on PATH, no Slurm answering, no environment, not submitting anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..common import slurm


def nothing_on_path(program: str) -> str | None:
    """``which`` of a world where no program is installed."""
    return None


def no_filesystem(path: str) -> os.statvfs_result:
    """``os.statvfs`` of a world with no filesystem to ask: every path is unusable."""
    raise FileNotFoundError(2, "No such file or directory", path)


def no_setting(name: str) -> str | None:
    return None


def slurm_unreachable(argv: list[str]) -> str | None:
    """A Slurm query of a world with no Slurm: nothing answers (see :func:`allocstack.common.slurm.query`)."""
    return None


@dataclass(frozen=True)
class Facts:
    """The world a plan is made for.

    :param scripts: ``workflow/scripts`` (relative to ``cwd``, as every path of a rule).
    :param cwd: the directory Snakemake runs in (absolute paths are made from it).
    :param python: the interpreter running Snakemake.
    :param deployment: Snakemake's software deployment methods (``--sdm``: ``conda``, ``apptainer``,
        ``env-modules``): with conda the rules run ``python``; apptainer switches an Apptainer image on.
    :param default_resources: the profile's (or the command line's) default resources, raw values.
    :param skip_validation: a module's ``skip_validation``: no schema validation, no defaults.
    :param environ: the environment Snakemake runs in (``SLURM_JOB_ID``, ``SLURMD_NODENAME``...).
    :param user: who runs it (whose Slurm accounts are asked for).
    :param hostname: where it runs (inside an allocation: one of its nodes, or refused).
    :param which: ``shutil.which`` of this world (a container runtime's program).
    :param is_file: whether an input file exists.
    :param exists: whether a path (a mount's source) exists.
    :param slurm_query: how Slurm is asked (:data:`allocstack.common.slurm.Query`, captured text in tests).
    :param tempdir: the temporary directory Snakemake's jobs get as $TMPDIR (``tempfile.gettempdir()``: Python
        silently skips a $TMPDIR it cannot use).
    :param sysctl: a kernel setting by its sysctl name (:func:`allocstack.common.namespaces.read_setting`), None
        where the kernel lacks it: may users make user namespaces (config network.isolation: private)?
    :param statvfs: ``os.statvfs`` of this world (is $TMPDIR read-only, full?).
    """

    scripts: str = "workflow/scripts"
    cwd: str = "/"
    python: str = "python3"
    deployment: frozenset[str] = frozenset()
    default_resources: Mapping[str, object] = field(default_factory=dict)
    skip_validation: bool = False
    environ: Mapping[str, str] = field(default_factory=dict)
    user: str = ""
    hostname: str = ""
    which: Callable[[str], str | None] = nothing_on_path
    is_file: Callable[[str], bool] = os.path.isfile
    exists: Callable[[str], bool] = os.path.exists
    slurm_query: slurm.Query = slurm_unreachable
    tempdir: str = ""
    statvfs: Callable[[str], os.statvfs_result] = no_filesystem
    sysctl: Callable[[str], str | None] = no_setting

    @property
    def job_id(self) -> str:
        """The Slurm job Snakemake runs in ('' outside one)."""
        return self.environ.get("SLURM_JOB_ID", "")

    @property
    def submits_to_slurm(self) -> bool:
        """Snakemake is about to submit to Slurm (the profile names an account or a partition), not
        running inside a job."""
        return bool({"slurm_account", "slurm_partition"} & set(self.default_resources)) and not self.job_id

    def absolute(self, path: str) -> str:
        """``path`` as an absolute path, relative ones taken from ``cwd``."""
        return os.path.normpath(os.path.join(self.cwd, path))
