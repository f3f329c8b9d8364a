"""The check: every worker read the same secret and config as the check reads itself."""

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--settings", required=True)
parser.add_argument("--out", required=True)
args = parser.parse_args()
token_file = os.environ["TOKEN_FILE"]
digest = hashlib.sha256(Path(token_file).read_bytes()).hexdigest()
settings = Path(args.settings).read_text()
outputs = sorted(Path(args.out).glob("*.json"))
if not outputs:
    sys.exit("check: no worker wrote what it read")
for output in outputs:
    read = json.loads(output.read_text())
    if (read["tokenFile"], read["tokenSha256"], read["settingsFile"], read["settings"]) != \
            (token_file, digest, args.settings, settings):
        sys.exit(f"check: {output.name} read another secret or config than {token_file}, {args.settings}: {read}")
print(f"check: {len(outputs)} workers read the secret at {token_file} (sha256 {digest[:12]}) and the config at "
      f"{args.settings}: {settings.splitlines()[-1]}", flush=True)
