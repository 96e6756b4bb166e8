#!/usr/bin/env bash
if nvidia-smi -L | grep -q H200; then bash .devout/next-29.sh; else AA_START=baseline bash .devout/aa8b.sh; fi
