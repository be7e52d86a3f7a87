//! The stats socket (`uswap::stats_server`): a pager serves the counters `Pager::stats`
//! reports, on `uswap.<pid>.<n>`, listed in /proc/net/unix, gone when the pager is.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;
use uswap::stats_server::{self, QueryError};
use uswap::{DeviceConfig, FaultMode, Pager, Stats, PAGE_SIZE};

mod common;
use common::*;

/// Pagers built here take socket numbers from one process-wide sequence: one test at a time,
/// so that a test can predict the next number.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// The numeric top-level fields of a snapshot, without the socket's own figures.
fn numbers(s: &Stats) -> Vec<(String, u64)> {
    let v = serde_json::to_value(s).unwrap();
    v.as_object().unwrap().iter().filter_map(|(k, v)| Some((k.clone(), v.as_u64()?))).collect()
}

fn without_publish(s: &Stats) -> Stats {
    Stats { publish: Default::default(), ..s.clone() }
}

/// Gauges: everything else in `Stats` only grows.
const GAUGES: [&str; 4] = ["resident_pages", "swapcache_pages", "clean_pages", "limit_pages"];

fn touch_four_times_the_limit(mode: FaultMode) -> (Pager, uswap::Region) {
    let limit = 4 * MIB;
    let pager = pager(mode, limit, 64 * MIB);
    let region = pager.map(4 * limit as usize).unwrap();
    let words = region.as_atomic_u64s();
    let nr_pages = region.len() / PAGE_SIZE;
    write_every_page(words);
    for i in 0..nr_pages {
        check_page(words, i, 1);
    }
    (pager, region)
}

fn socket_answers_with_the_pagers_counters(mode: FaultMode) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (pager, region) = touch_four_times_the_limit(mode);
    let name = pager.stats_socket().expect("published by default").to_string();
    let (pid, _) = stats_server::parse_socket_name(&name).expect("uswap.<pid>.<n>");
    assert_eq!(pid, std::process::id());
    assert!(stats_server::socket_names(pid).unwrap().contains(&name), "{name} not in /proc/net/unix");

    // Counters only grow: the answer lies between two snapshots taken around it.
    let before = pager.stats();
    let got = stats_server::query(&name, QUERY_TIMEOUT).unwrap();
    let after = pager.stats();
    assert!(got.pswpout > 0, "4x the limit touched, nothing swapped out: {got:?}");
    assert!(got.pgfault >= region.len() as u64 / PAGE_SIZE as u64 / 32, "{got:?}");
    for ((k, b), ((_, g), (_, a))) in numbers(&before).iter().zip(numbers(&got).iter().zip(numbers(&after).iter())) {
        if !GAUGES.contains(&k.as_str()) {
            assert!(b <= g && g <= a, "{k}: {b} <= {g} <= {a} does not hold");
        }
    }
    assert_eq!(got.devices.len(), 1);
    assert_eq!(got.devices[0].name, "ram");
    assert_eq!(got.devices[0].nr_slots, before.devices[0].nr_slots);
    assert_eq!(got.publish.socket.as_deref(), Some(name.as_str()));
    assert_eq!(got.publish.peers_refused, 0);

    // Once the engine is quiet (the idle reclaimer may still be moving pages), the answer is
    // exactly what `Pager::stats` says, every field.
    let t0 = Instant::now();
    loop {
        let before = pager.stats();
        let got = stats_server::query(&name, QUERY_TIMEOUT).unwrap();
        let after = pager.stats();
        if without_publish(&before) == without_publish(&after) {
            assert_eq!(without_publish(&got), without_publish(&before));
            // The socket's own counts: this query included, and `stats` reports them too.
            assert_eq!(got.publish.queries, after.publish.queries);
            assert!(got.publish.queries >= 2);
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "the counters never stood still for one query");
        std::thread::sleep(Duration::from_millis(50));
    }

    // The JSON document names what the CLI reads.
    let v: Value = serde_json::to_value(&got).unwrap();
    for k in ["pswpin", "pswpout", "pgfault", "resident_pages", "limit_pages", "devices", "fault_latency_us"] {
        assert!(v.get(k).is_some(), "{k} missing");
    }

    drop(region);
    drop(pager);
    assert!(!stats_server::socket_names(pid).unwrap().contains(&name), "{name} still listed after the pager dropped");
    assert!(matches!(stats_server::query(&name, QUERY_TIMEOUT), Err(QueryError::Gone { .. })));
}

in_both_modes!(
    socket_answers_with_the_pagers_counters() =>
    thread_mode_socket_answers_with_the_pagers_counters_and_goes_with_it,
    signal_mode_socket_answers_with_the_pagers_counters_and_goes_with_it
);

#[test]
fn every_pager_of_a_process_has_its_own_socket() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    let a = pager(FaultMode::Thread, 4 * MIB, 16 * MIB);
    let b = Pager::builder()
        .resident_limit(8 * MIB)
        .device(DeviceConfig::zpool(16 * MIB))
        .device(DeviceConfig::ram(16 * MIB))
        .build()
        .unwrap();
    let (na, nb) = (a.stats_socket().unwrap().to_string(), b.stats_socket().unwrap().to_string());
    let (_, sa) = stats_server::parse_socket_name(&na).unwrap();
    let (_, sb) = stats_server::parse_socket_name(&nb).unwrap();
    assert_eq!(sb, sa + 1, "{na} then {nb}");
    let listed = stats_server::socket_names(pid).unwrap();
    let ia = listed.iter().position(|n| *n == na).expect("a listed");
    let ib = listed.iter().position(|n| *n == nb).expect("b listed");
    assert!(ia < ib, "listed in order of n: {listed:?}");
    let (qa, qb) = (stats_server::query(&na, QUERY_TIMEOUT).unwrap(), stats_server::query(&nb, QUERY_TIMEOUT).unwrap());
    assert_eq!(qa.limit_pages, 4 * MIB / PAGE_SIZE as u64);
    assert_eq!(qb.limit_pages, 8 * MIB / PAGE_SIZE as u64);
    assert_eq!(qb.devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["zpool(lz4)", "ram"]);
    assert!(qb.devices[0].backend.is_some(), "the pool's own counters");
    drop(a);
    let listed = stats_server::socket_names(pid).unwrap();
    assert!(!listed.contains(&na) && listed.contains(&nb), "{listed:?}");
}

#[test]
fn publish_stats_off_serves_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    let listed = stats_server::socket_names(pid).unwrap();
    let p = Pager::builder()
        .resident_limit(4 * MIB)
        .device(DeviceConfig::ram(16 * MIB))
        .publish_stats(false)
        .build()
        .unwrap();
    assert_eq!(p.stats_socket(), None);
    assert_eq!(p.stats().publish, Default::default());
    assert_eq!(stats_server::socket_names(pid).unwrap(), listed);
}

#[test]
fn a_socket_that_cannot_be_bound_is_reported_and_the_pager_works_without_it() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    // Take the name the next pager would get.
    let (_, n) = stats_server::parse_socket_name(&stats_server::next_socket_name()).unwrap();
    let squatter = stats_server::socket_name(pid, n + 1);
    let _held = stats_server::serve(&squatter, Stats::default).unwrap();
    let (pager, region) = touch_four_times_the_limit(FaultMode::Thread);
    assert_eq!(pager.stats_socket(), None);
    let s = pager.stats();
    let err = s.publish.error.clone().expect("the failure is reported in stats");
    assert!(err.contains(&squatter), "{err}");
    assert!(s.pswpout > 0 && s.publish.socket.is_none(), "{s:?}");
    // The name still answers for its owner, not for the pager.
    assert_eq!(stats_server::query(&squatter, QUERY_TIMEOUT).unwrap().pswpout, 0);
    drop(region);
}
