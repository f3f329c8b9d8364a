"""What every process shares: diagnostics, names, JSON files, the command line, the event log, disk space,
Slurm, endpoints, job-scoped scratch, the task documents, TLS, the network address, forked work, what a process
listens on (/proc), whether the node allows user namespaces.
"""
