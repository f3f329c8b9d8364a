"""Every job's answer is in --spool and right (a + b = 11 N)."""

import argparse
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--spool", required=True)
parser.add_argument("--jobs", type=int, required=True)
args = parser.parse_args()
wrong = []
for number in range(args.jobs):
    path = os.path.join(args.spool, f"answer-{number}.txt")
    if not os.path.exists(path):
        wrong.append(number)
        continue
    with open(path) as answer:
        if answer.read() != str(11 * number):
            wrong.append(number)
if wrong:
    sys.exit(f"check: jobs without a right answer: {wrong}")
print(f"check: {args.jobs} answers, all correct")
