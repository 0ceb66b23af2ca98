#!/usr/bin/env bash
# The ABBA run of grpo-burst.md's "Restores member by member": AGENTD_BEFORE
# and AGENTD_AFTER are release builds of 78bf3cd and of the change, OUT a
# scratch folder; then `plot.py old1.json new1.json new2.json old2.json req1.json |
# benches/lib/bars.py` draws the figure.
set -u
S=$(dirname "$0")/../arm.sh
export OUT=${OUT:-.}
AGENTD=$AGENTD_BEFORE $S old1 8101
AGENTD=$AGENTD_AFTER $S new1 8102
AGENTD=$AGENTD_AFTER $S new2 8103
AGENTD=$AGENTD_BEFORE $S old2 8104
AGENTD=$AGENTD_AFTER $S req1 8105 --scheduler request
