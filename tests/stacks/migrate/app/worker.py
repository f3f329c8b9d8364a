"""A worker: asks the API for the schema it serves (the migration's), and ends."""
import sys

from apischema import report_schema

sys.exit(report_schema("worker"))
