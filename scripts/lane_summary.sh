#!/usr/bin/env sh
# make test's last lines: each lane's exit status and pytest's failure summary, so that a truncated log (a CI page
# shows its tail) still names what failed, whichever lane it was in.
# usage: scripts/lane_summary.sh NAME=RC:LOG ...
status=0
echo "==== make test: the lanes ===="
for lane in "$@"; do
    name=${lane%%=*}; status_log=${lane#*=}; rc=${status_log%%:*}; log=${status_log#*:}
    if [ "$rc" -eq 0 ]; then verdict=passed; else verdict="FAILED (exit $rc)"; status=1; fi
    echo "-- $name: $verdict ($log)"
    if [ -f "$log" ]; then
        # pytest's "short test summary info" block, or the log's last lines where there is none (a crash, a timeout)
        if grep -q "short test summary info" "$log"; then
            sed -n '/short test summary info/,$p' "$log" | tail -n 40
        elif [ "$rc" -ne 0 ]; then
            tail -n 20 "$log"
        fi
    fi
done
exit $status
