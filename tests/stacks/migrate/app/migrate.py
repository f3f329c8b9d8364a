"""The migration: stores schema v7 in the database and exits 0 (FAIL_MIGRATION=1: fails as a migration does)."""
import argparse
import os
import sys
import urllib.request

parser = argparse.ArgumentParser()
parser.add_argument("--db", required=True)
args = parser.parse_args()
if os.environ.get("FAIL_MIGRATION") == "1":
    print("migrate: relation \"users\" already exists", file=sys.stderr)
    sys.exit(1)
request = urllib.request.Request(f"{args.db}/schema", data=b"v7", method="PUT")
urllib.request.urlopen(request, timeout=5).close()
print("migrate: schema v7 applied")
