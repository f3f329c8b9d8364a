"""The check, once every worker completed: the API still serves the migration's schema."""
import sys

from apischema import report_schema

sys.exit(report_schema("check"))
