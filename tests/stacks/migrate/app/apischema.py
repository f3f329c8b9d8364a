"""What the workers and the check share: ask the API which schema it serves, say so, and succeed when it is the
migration's (v7)."""
import argparse
import urllib.request


def report_schema(who: str) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", required=True)
    args = parser.parse_args()
    schema = urllib.request.urlopen(f"{args.api}/schema", timeout=5).read().decode()
    print(f"{who}: the api serves schema {schema}")
    return int(schema != "v7")
