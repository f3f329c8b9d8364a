"""A worker: reads the secret (at $TOKEN_FILE) and the config (--settings), and writes what it read to the
named volume (--out): the secret's SHA-256, never the secret itself, and the config's text."""

import argparse
import hashlib
import json
import os
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--settings", required=True)
parser.add_argument("--out", required=True)
args = parser.parse_args()
token = Path(os.environ["TOKEN_FILE"]).read_bytes()
read = {"tokenFile": os.environ["TOKEN_FILE"], "tokenSha256": hashlib.sha256(token).hexdigest(),
        "settingsFile": args.settings, "settings": Path(args.settings).read_text()}
Path(args.out, f"{os.environ['ALLOCSTACK_WORKER_ID']}.json").write_text(json.dumps(read))
print(f"worker: read {read['tokenFile']} and {read['settingsFile']}", flush=True)
