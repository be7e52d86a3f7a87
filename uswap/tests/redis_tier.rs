//! The Redis tier against real `redis-server` processes on 127.0.0.1: workloads through
//! `zpool` then `redis` in both fault modes, a primary killed with a replica promoted, a
//! store lost with no replica, a page corrupted from outside, a full store, and an evicting
//! store refused. Every byte read is verified. Each test skips, saying so, only when
//! `redis-server` is not installed (`apt-get install redis-server`); every server a test
//! starts is killed when the test ends ([`LocalRedis`] kills on drop), and every wait has a
//! deadline.

use std::time::{Duration, Instant};

use uswap::backend::redis::{redis_server_available, LocalRedis, RedisOptions};
use uswap::{DeviceConfig, FaultMode, Pager, Stats, PAGE_SIZE};

mod common;
use common::*;

/// `None` (and a message saying the test is skipped) without `redis-server`.
fn servers(primaries: usize, replicas: usize, extra: &[&str]) -> Option<LocalRedis> {
    if !redis_server_available() {
        eprintln!("SKIPPED: redis-server is not installed (apt-get install redis-server)");
        return None;
    }
    Some(LocalRedis::start(primaries, replicas, extra).expect("local redis servers start"))
}

fn redis_dev(r: &LocalRedis, capacity: u64, f: impl FnOnce(&mut RedisOptions)) -> DeviceConfig {
    let mut o = RedisOptions::new(r.seeds(0));
    f(&mut o);
    DeviceConfig::redis(r.seeds(0), capacity).redis_options(o)
}

fn build(mode: FaultMode, limit: u64, devices: Vec<DeviceConfig>) -> Pager {
    let mut b = Pager::builder().resident_limit(limit).fault_mode(mode);
    for d in devices {
        b = b.device(d);
    }
    b.build().expect("pager")
}

fn redis_cmd(addr: &str, args: &[&str]) -> redis::Value {
    let client = redis::Client::open(format!("redis://{addr}/")).unwrap();
    let mut con = client.get_connection_with_timeout(Duration::from_secs(2)).unwrap();
    con.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(&mut con).unwrap_or_else(|e| panic!("{args:?} on {addr}: {e}"))
}

fn redis_keys(addr: &str) -> Vec<String> {
    match redis_cmd(addr, &["KEYS", "uswap:*"]) {
        redis::Value::Array(v) => v
            .into_iter()
            .map(|k| match k {
                redis::Value::BulkString(b) => String::from_utf8(b).unwrap(),
                other => panic!("{other:?}"),
            })
            .collect(),
        other => panic!("{other:?}"),
    }
}

/// Writes every page, then random reads and rewrites from two threads on disjoint pages
/// for `rounds`, then checks every page. Calls `before_unmap` while the region still
/// exists, and returns the stats from then.
fn churn(p: &Pager, region_bytes: u64, rounds: usize, before_unmap: impl FnOnce()) -> Stats {
    let region = p.map(region_bytes as usize).unwrap();
    let words = region.as_atomic_u64s();
    let nr_pages = region.len() / PAGE_SIZE;
    for i in 0..nr_pages {
        write_page(words, i, 1);
    }
    std::thread::scope(|s| {
        for t in 0..2 {
            s.spawn(move || {
                let mine: Vec<usize> = (t..nr_pages).step_by(2).collect();
                let mut version = vec![1u64; mine.len()];
                let mut rng = Rng(0xfeed + t as u64);
                for _ in 0..rounds {
                    let j = (rng.next() % mine.len() as u64) as usize;
                    check_page(words, mine[j], version[j]);
                    if rng.next() % 4 == 0 {
                        version[j] += 1;
                        write_page(words, mine[j], version[j]);
                    }
                }
                for (j, &i) in mine.iter().enumerate() {
                    check_page(words, i, version[j]);
                }
            });
        }
    });
    before_unmap();
    p.stats()
}

fn zpool_then_redis(mode: FaultMode) {
    let Some(r) = servers(1, 0, &[]) else { return };
    let p = build(
        mode,
        16 * MIB,
        vec![DeviceConfig::zpool(4 * MIB).priority(10), redis_dev(&r, 256 * MIB, |_| {})],
    );
    let mut keys_while_mapped = 0;
    let st = churn(&p, 64 * MIB, 20_000, || keys_while_mapped = redis_keys(&r.addr(0)).len());
    let dev = st.devices[1].backend.clone().expect("the redis device reports its counters");
    assert!(st.writeback > 0 || st.swpout_spilled > 0, "pages reached the redis tier: {st:?}");
    assert!(dev.stored_pages > 0, "{dev:?}");
    assert!(st.pswpin > 0, "{st:?}");
    assert_eq!((st.fault_error, st.checksum_errors, st.slots_leaked), (0, 0, 0), "{st:?}");
    // Freed slots' keys are deleted (in batches, by the device threads): the region is gone.
    assert!(keys_while_mapped > 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !redis_keys(&r.addr(0)).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(redis_keys(&r.addr(0)), Vec::<String>::new(), "freed slots' keys were deleted");
    drop(p);
    assert_eq!(redis_keys(&r.addr(0)), Vec::<String>::new(), "the pager deleted its keys");
}

in_both_modes!(zpool_then_redis() => zpool_then_redis_thread_mode, zpool_then_redis_signal_mode);
