#!/usr/bin/env bash
# Issue 19.5 on a GPU machine: does any nsys process outlive a timed-out run? (tests/gpu/agent_e2e.py)
#   bash tests/gpu/agent_e2e.sh      (repository root; carry .dw/ with libdw1 and libelf1 .debs)
set -uo pipefail
mkdir -p /tmp/dw
for f in .dw/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NSYS=${NSYS:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
python3 tests/gpu/agent_e2e.py
