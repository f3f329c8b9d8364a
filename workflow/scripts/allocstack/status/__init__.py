"""What the person watching a run sees: Snakemake's terminal, and a finished run read back from its records
(the end-of-run summary, status.py).
"""
