"""A worker: asks the API for the schema it serves (the migration's), and ends."""
import argparse
import sys
import urllib.request

parser = argparse.ArgumentParser()
parser.add_argument("--api", required=True)
args = parser.parse_args()
schema = urllib.request.urlopen(f"{args.api}/schema", timeout=5).read().decode()
print(f"worker: the api serves schema {schema}")
sys.exit(schema != "v7")
