#!/usr/bin/env bash
# session 29 first call: an H200 -> issue 29's table (next-29.sh, ~375 s); otherwise aa-procs (between-process A/A sd on a GPU, ~9 min)
if nvidia-smi -L | grep -q H200; then bash .devout/next-29.sh; else bash .devout/aa.sh; fi
