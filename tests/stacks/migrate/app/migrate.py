"""The migration: stores schema v7 in the database and exits 0 (FAIL_MIGRATION=1: fails as a migration does)."""
import argparse
import os
import sys
import time
import urllib.error
import urllib.request

parser = argparse.ArgumentParser()
parser.add_argument("--db", required=True)
args = parser.parse_args()
if os.environ.get("FAIL_MIGRATION") == "1":
    print("migrate: relation \"users\" already exists", file=sys.stderr)
    sys.exit(1)
# depends_on service_started waits for the database's process, not its port (in Compose too): as migration tools do,
# try again while the database is still starting (CI of 50faa84: refused 0.1 s before the database listened).
deadline = time.monotonic() + 30
while True:
    request = urllib.request.Request(f"{args.db}/schema", data=b"v7", method="PUT")
    try:
        urllib.request.urlopen(request, timeout=5).close()
        break
    except urllib.error.URLError as refused:
        if not isinstance(refused.reason, ConnectionRefusedError) or time.monotonic() > deadline:
            raise
        time.sleep(0.1)
print("migrate: schema v7 applied")
