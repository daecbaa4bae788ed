#!/usr/bin/env bash
# Runs test stages in order and prints how long each took, as a table at the
# end, also when a stage fails or the run is interrupted. Stops at the first
# stage that fails (as make does) and exits with its status.
#   scripts/stages.sh TITLE "NAME=COMMAND" ...
# e.g. scripts/stages.sh "make test" "unit=make test-unit" "host=make test-host"
# A stages.sh run inside a stage (.ci/run's "test" stage is `make test`, which
# has stages of its own) adds its rows to the outer run's table, indented,
# instead of printing a table of its own.
set -uo pipefail

title=${1:?usage: $0 TITLE NAME=COMMAND...}
shift
# Rows: depth, name, status, seconds; one a line, tab-separated.
outer=0
if [[ -z ${SPORE_STAGES_TABLE:-} ]]; then
    outer=1
    SPORE_STAGES_TABLE="$(mktemp /tmp/spore-stages.XXXXXX)"
    export SPORE_STAGES_TABLE SPORE_STAGES_DEPTH=0
fi
depth=${SPORE_STAGES_DEPTH:-0}

print_table() {
    local d name st secs total=0
    echo
    echo "== $title: time per stage"
    printf '%-28s %-10s %9s\n' stage status "wall"
    while IFS=$'\t' read -r d name st secs; do
        ((d == 0)) && total=$((total + secs))
        printf '%-28s %-10s %6d:%02d\n' "$(printf '%*s%s' $((d * 2)) '' "$name")" "$st" $((secs / 60)) $((secs % 60))
    done <"$SPORE_STAGES_TABLE"
    printf '%-28s %-10s %6d:%02d\n' total "" $((total / 60)) $((total % 60))
    rm -f "$SPORE_STAGES_TABLE"
}

# set_row LINE STATUS: the row of the running stage (its line in the table,
# written when it started, above the rows of its own stages).
set_row() {
    awk -v n="$1" -v row="$(printf '%d\t%s\t%s\t%d' "$depth" "$running" "$2" $((SECONDS - started)))" \
        'NR == n { print row; next } { print }' "$SPORE_STAGES_TABLE" >"$SPORE_STAGES_TABLE.new" &&
        mv "$SPORE_STAGES_TABLE.new" "$SPORE_STAGES_TABLE"
}

rc=0 running="" started=0 row=0
finish() {
    # Interrupted inside a stage: its row says so.
    [[ -z $running ]] || set_row "$row" interrupted
    ((outer)) && print_table
}
trap finish EXIT
trap 'rc=130; exit 130' INT
trap 'rc=143; exit 143' TERM

stages=("$@")
for ((i = 0; i < ${#stages[@]}; i++)); do
    spec=${stages[i]}
    name=${spec%%=*} cmd=${spec#*=}
    if ((rc != 0)); then
        printf '%d\t%s\t%s\t%d\n' "$depth" "$name" "not run" 0 >>"$SPORE_STAGES_TABLE"
        continue
    fi
    echo "== stage: $name ($cmd)" >&2
    running=$name started=$SECONDS
    printf '%d\t%s\t%s\t%d\n' "$depth" "$name" running 0 >>"$SPORE_STAGES_TABLE"
    row=$(wc -l <"$SPORE_STAGES_TABLE")
    SPORE_STAGES_DEPTH=$((depth + 1)) bash -c "$cmd"
    st=$?
    if ((st == 0)); then
        set_row "$row" passed
    else
        rc=$st
        set_row "$row" "failed ($st)"
    fi
    running=""
done
exit $rc
