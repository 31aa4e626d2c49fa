#!/bin/bash
# usage: screen.sh LISTS SEEDS variant...   (2 in parallel) appends to results.jsonl
L=$1; S=$2; shift 2
printf "%s\n" "$@" | xargs -P 2 -I{} sh -c "cd /work/main && .venv/bin/python experiments_tmp/harness.py {} $L $S" >> /work/main/experiments_tmp/results.jsonl
