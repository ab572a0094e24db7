#!/usr/bin/env bash
# The 16-core benchmark runs of docs/benchmarks.md, as one script for a lent machine.
#
#   scripts/bench-device.sh pack
#       here: builds the release binaries and packs them, stripped, with nats-server,
#       into target/device.tar.xz (about 22 MB): carry that path to the machine.
#   scripts/bench-device.sh run [BUDGET_S]
#       there: runs the benchmarks in order of what they settle, each only if its usual
#       time still fits in BUDGET_S seconds (default 540), and writes each report (JSON,
#       and the log ending in the table) and the CPU topology into $OUT (default
#       ./device-out).
#
# Placement as in docs/benchmarks.md: servers on CPU 1 (scale-out: 1-3), the benchmark,
# nats-server and the ingester on the CPUs left, the scale-out's fleet processes on
# 4-12. Each report's machine line says whether a server CPU shares its physical core.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=target/device
PACK=target/device.tar.xz

pack() {
    cargo build --release -q -p shoal-server -p shoal-ingester -p shoal-bench
    rm -rf "$DIR" && mkdir -p "$DIR"
    for b in shoal-server shoal-ingester shoal-bench shoal-replay; do
        strip -o "$DIR/$b" "target/release/$b"
    done
    cp "$(command -v nats-server)" "$DIR/"
    tar -cf - -C target device | xz -T0 -6 >"$PACK"
    ls -la "$PACK"
}

run() {
    local budget=${1:-540} out=${OUT:-device-out} start=$SECONDS
    mkdir -p "$out"
    if [[ -f $PACK && ! -d $DIR ]]; then
        tar -xJf "$PACK" -C target
    fi
    export PATH="$PWD/$DIR:$PATH"
    ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
    { nproc; lscpu -e 2>/dev/null || true; grep . /sys/devices/system/cpu/cpu*/topology/thread_siblings_list 2>/dev/null || true; } >"$out/topology.txt"
    local B=("$DIR/shoal-bench" --bin-dir "$DIR" --namespaces 20 --services 1000 --endpoints 10 --phase-timeout 240)
    # name, usual seconds on the 16-core machine, CPUs of the benchmark, the environment
    # of its processes (the server's settings), its arguments
    local runs=(
        "captured-2000|150|5-15||--server-cpus 1 --proxies 2000 --scenario captured --changes 5 --baseline replay"
        "captured-2000-uncorked|100|5-15|SHOAL_XDS_WRITE_CORK=false|--server-cpus 1 --proxies 2000 --scenario captured --changes 5 --baseline none"
        "flat-2000|90|5-15||--server-cpus 1 --proxies 2000 --scenario flat --changes 5 --baseline none"
        "scaleout-3x4500|120|0,13-15||--scale-out --replicas 3 --proxies 13500 --scenario captured --changes 1 --baseline none --server-cpus 1,2,3 --fleet-processes --fleet-cpus 4-12"
        "lone-4500|90|0,13-15||--scale-out --replicas 1 --proxies 4500 --scenario captured --changes 1 --baseline none --server-cpus 1 --fleet-processes --fleet-cpus 4-6"
        "captured-8000|180|5-15||--server-cpus 1 --proxies 8000 --scenario captured --changes 1 --baseline replay"
        "isolated-2000|60|5-15||--server-cpus 1 --proxies 2000 --scenario isolated --changes 5 --baseline none"
    )
    for r in "${runs[@]}"; do
        IFS='|' read -r name secs cpus envs args <<<"$r"
        local left=$((budget - (SECONDS - start)))
        if ((left < secs)); then
            echo "$name: skipped, ${left}s left of ${budget}s" | tee -a "$out/summary.txt"
            continue
        fi
        # shellcheck disable=SC2086 # the arguments are words
        if env $envs timeout "$left" taskset -c "$cpus" "${B[@]}" $args --json >"$out/$name.json" 2>"$out/$name.log"; then
            echo "$name: done in $((SECONDS - start))s" | tee -a "$out/summary.txt"
        else
            echo "$name: failed (rc $?), see $name.log" | tee -a "$out/summary.txt"
        fi
    done
}

case "${1:-}" in
pack) pack ;;
run) run "${2:-}" ;;
*)
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 2
    ;;
esac
