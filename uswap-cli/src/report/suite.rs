//! The standard suite `uswap report` runs: each entry is a `uswap bench` command line (the
//! flags, without `--runs`, which the report adds) and the section of BENCHMARKS.md it
//! fills. Adding a comparison is adding an entry here; its section appears at the end of
//! BENCHMARKS.md on the next regeneration, ready for a hand-written reading.

/// One comparison of the suite.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// Names the generated block in BENCHMARKS.md and the plot files.
    pub id: &'static str,
    /// The section heading used when the section does not exist yet.
    pub title: &'static str,
    /// `uswap bench` flags (`--engines ENGINES` is added unless given).
    pub args: &'static str,
}

/// The engines of an entry that names none.
pub const ENGINES: &str = "kernel-zram,kernel-file,uswap-signal,uswap-thread,ram";

pub const SUITE: &[Entry] = &[
    Entry {
        id: "engine-core",
        title: "memtouch: random access, 1 GiB working set, 256 MiB limit",
        args: "--workload memtouch --pattern random --wss 1GiB --limit 256MiB --accesses 500000",
    },
    Entry {
        id: "usemem-seq",
        title: "usemem: sequential fill and two sequential passes, 2 threads",
        args: "--workload usemem --pattern seq --threads 2 --wss 1GiB --limit 256MiB --accesses 268435456",
    },
    Entry {
        id: "usemem-random-procs",
        title: "usemem: random word accesses, 2 processes",
        args: "--workload usemem --pattern random --procs 2 --wss 1GiB --limit 256MiB --accesses 500000",
    },
    Entry {
        id: "pmbench-zipf",
        title: "pmbench: zipf (skew 0.99), 80 % reads",
        args: "--workload pmbench --pattern zipf --zipf-skew 0.99 --read-pct 80 --wss 1GiB --limit 256MiB --accesses 1000000",
    },
    Entry {
        id: "pmbench-normal",
        title: "pmbench: normal (sd 1/8 of the working set), 80 % reads",
        args: "--workload pmbench --pattern normal --normal-sd 0.125 --read-pct 80 --wss 1GiB --limit 256MiB --accesses 1000000",
    },
    Entry {
        id: "combined",
        title: "combined (seed 001): a sequential stream and a random worker at once",
        args: "--workload combined --pattern random --read-pct 0 --seq-streams 1 --threads 1 --wss 1GiB --limit 256MiB --accesses 500000",
    },
    Entry {
        id: "tiers-pool",
        title: "Tiers: the compressed pool (and pool + file) against zram, random access",
        args: "--workload memtouch --pattern random --wss 1GiB --limit 256MiB --accesses 500000 \
               --engines kernel-zram,uswap-signal@zpool,uswap-thread@zpool,uswap-signal@zpool:128MiB+file:/var/tmp:4GiB",
    },
    Entry {
        id: "file-random",
        title: "Tiers: the file device against the kernel's swap file on the same disk, random access",
        args: "--workload memtouch --pattern random --wss 1GiB --limit 256MiB --accesses 200000 \
               --engines kernel-file,uswap-signal@file:/var/tmp,uswap-thread@file:/var/tmp --baseline kernel-file",
    },
    Entry {
        id: "file-seq",
        title: "Readahead: the file device against the kernel's swap file, sequential re-read",
        args: "--workload memtouch --pattern seq --wss 1GiB --limit 256MiB --accesses 524288 \
               --engines kernel-file,uswap-signal@file:/var/tmp,uswap-thread@file:/var/tmp --baseline kernel-file",
    },
    Entry {
        id: "readahead-seq",
        title: "Readahead: sequential re-read of a swapped-out 1 GiB region, 256 MiB limit",
        args: "--workload memtouch --pattern seq --wss 1GiB --limit 256MiB --accesses 524288 \
               --engines kernel-zram,uswap-signal,uswap-thread,uswap-signal@zpool,uswap-thread@zpool",
    },
    Entry {
        id: "threads-2",
        title: "Threads: 2 application threads, random over the pool",
        args: "--workload memtouch --pattern random --threads 2 --wss 1GiB --limit 256MiB --accesses 500000 \
               --engines kernel-zram,uswap-signal@zpool,uswap-thread@zpool",
    },
    Entry {
        id: "threads-8",
        title: "Threads: 8 application threads on the 2 vCPUs, random over the pool",
        args: "--workload memtouch --pattern random --threads 8 --wss 1GiB --limit 256MiB --accesses 500000 \
               --engines kernel-zram,uswap-signal@zpool,uswap-thread@zpool",
    },
    Entry {
        id: "threads-32",
        title: "Threads: 32 application threads on the 2 vCPUs, random over the pool",
        args: "--workload memtouch --pattern random --threads 32 --wss 1GiB --limit 256MiB --accesses 500000 \
               --engines kernel-zram,uswap-signal@zpool,uswap-thread@zpool",
    },
    Entry {
        id: "readahead-random",
        title: "Readahead: uniform random access with readahead on and off",
        args: "--workload memtouch --pattern random --wss 1GiB --limit 256MiB --accesses 500000 \
               --engines kernel-zram,uswap-signal,uswap-signal/ra-off,uswap-thread,uswap-thread/ra-off",
    },
];

impl Entry {
    /// The full `uswap bench` flags, with the default engines unless the entry names some.
    pub fn bench_args(&self) -> String {
        if self.args.contains("--engines") {
            self.args.to_string()
        } else {
            format!("{} --engines {ENGINES}", self.args)
        }
    }
}
