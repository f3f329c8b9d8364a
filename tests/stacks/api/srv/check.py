"""The stack's check: the API has a correct answer for every number, from the workers."""
import argparse
import json
import os
import sys
import urllib.request

parser = argparse.ArgumentParser()
parser.add_argument("--count", type=int, required=True)
args = parser.parse_args()
answers = json.load(urllib.request.urlopen(os.environ["API_URL"] + "/answers", timeout=5))
wrong = [n for n in range(1, args.count + 1)
         if answers.get(str(n), {}).get("value") != sum(d for d in range(1, n + 1) if n % d == 0)]
if wrong or len(answers) != args.count:
    sys.exit(f"check failed: {len(answers)} answers for {args.count} numbers; wrong or missing: {wrong}")
print(f"check: {args.count} answers from {len({a['worker'] for a in answers.values()})} workers, all correct")
