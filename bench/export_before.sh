#!/usr/bin/env bash
# Export the code at REV (babysit/, bot/, bench/, trainer/) into DIR, for the benches' --before DIR:
# the same measurement run on the code before a change, in the same run, on the same machine.
#   bash bench/export_before.sh b34f572 /tmp/babysit-before
set -eu
rev=${1:?usage: export_before.sh REV DIR}
dir=${2:?usage: export_before.sh REV DIR}
cd "$(dirname "$0")/.."
mkdir -p "$dir"
git archive "$rev" babysit bot bench trainer | tar -x -C "$dir"
echo "$dir: $(git log -1 --format='%h %s' "$rev" | cut -c1-80)"
