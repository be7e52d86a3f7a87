# Sourced by the real-programs scripts: the engine this script runs under, as `uswap bench`
# names it (uswap-signal and uswap-thread set USWAP_FAULT_MODE; the kernel engines swap to
# zram or to a file, and the swap is theirs alone during the run).
engine_name() {
    if [ -n "${USWAP_FAULT_MODE:-}" ]; then echo "uswap-$USWAP_FAULT_MODE"
    elif grep -q zram /proc/swaps; then echo kernel-zram
    else echo kernel-file
    fi
}
