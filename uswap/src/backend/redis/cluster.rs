//! Redis Cluster: where a key lives, and what a node answers when it is not there.
//!
//! The groundwork of the cluster device (issue "Cluster"): a cluster splits its key space
//! into [`NR_HASH_SLOTS`] hash slots, each served by one primary (and its replicas). A key's
//! hash slot is the CRC16 (XMODEM) of the key, or of its *hash tag*, the part between the
//! first `{` and the next `}` when that part is not empty (Redis Cluster specification,
//! "Hash tags"). uswap tags each key with its swap cluster ([`slot_tag`]): the pages of one
//! cluster of 512 device slots share a hash slot, so a readahead window's `MGET` and a
//! swap-out batch's `MSET` go to one node unless they cross a cluster boundary, and then
//! they split into at most a few commands (see [`split_by_tag`]).
//!
//! * [`SlotMap`]: which primary serves each hash slot, from `CLUSTER SLOTS`.
//! * [`Redirect`]: a `MOVED` (the slot has moved for good: update the map) or an `ASK` (it
//!   is migrating: send this one command to the other node, after `ASKING`).
//!
//! Locking: none; a map is a value that its owner (a device thread) replaces.
//! Invariant: a [`SlotMap`] built by [`SlotMap::from_cluster_slots`] names a node for every
//! hash slot, or it is refused.

use redis::Value;

/// Hash slots of a Redis Cluster.
pub const NR_HASH_SLOTS: u16 = 16384;

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as Redis Cluster computes it.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// The hash slot of `key`: of its hash tag if it has a non-empty one.
pub fn hash_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter().position(|&b| b == b'}').map(|close| &rest[..close])
        })
        .filter(|tag| !tag.is_empty());
    crc16(tagged.unwrap_or(key)) % NR_HASH_SLOTS
}

/// The hash tag of device slot `slot`'s keys: its swap cluster's number, so that the pages
/// of one cluster share a hash slot.
pub fn slot_tag(slot: u64) -> u64 {
    slot / crate::backend::SWAPFILE_CLUSTER as u64
}

/// Splits the consecutive device slots `[first, first + nr)` at swap-cluster boundaries:
/// the runs whose keys share a hash tag, in order, as `(first slot, slots)`.
pub fn split_by_tag(first: u64, nr: u64) -> impl Iterator<Item = (u64, u64)> {
    let cluster = crate::backend::SWAPFILE_CLUSTER as u64;
    let end = first + nr;
    let mut at = first;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let run_end = ((at / cluster) + 1).saturating_mul(cluster).min(end);
        let run = (at, run_end - at);
        at = run_end;
        Some(run)
    })
}

/// Which primary serves each hash slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMap {
    /// Primaries, `HOST:PORT`, in the order `CLUSTER SLOTS` first named them.
    pub nodes: Vec<String>,
    /// For each hash slot, its primary's index in `nodes`.
    owner: Box<[u16]>,
}

impl SlotMap {
    /// Builds the map from a `CLUSTER SLOTS` reply: an array of `[start, end, [host, port,
    /// id, ...], replicas...]`. Refused (with what is wrong) when a slot has no primary.
    pub fn from_cluster_slots(reply: &Value) -> Result<SlotMap, String> {
        const NONE: u16 = u16::MAX;
        let Value::Array(ranges) = reply else { return Err(format!("CLUSTER SLOTS answered {reply:?}")) };
        let mut nodes: Vec<String> = Vec::new();
        let mut owner = vec![NONE; NR_HASH_SLOTS as usize].into_boxed_slice();
        for r in ranges {
            let (start, end, addr) = parse_range(r).ok_or_else(|| format!("CLUSTER SLOTS: cannot read {r:?}"))?;
            let i = match nodes.iter().position(|n| *n == addr) {
                Some(i) => i,
                None => {
                    nodes.push(addr);
                    nodes.len() - 1
                }
            };
            for s in start..=end {
                owner[s as usize] = i as u16;
            }
        }
        if let Some(s) = owner.iter().position(|&o| o == NONE) {
            return Err(format!("hash slot {s} has no primary (the cluster is not fully covered)"));
        }
        Ok(SlotMap { nodes, owner })
    }

    /// The index in `nodes` of the primary serving `hash_slot`.
    pub fn node_of(&self, hash_slot: u16) -> usize {
        self.owner[hash_slot as usize] as usize
    }

    /// After a `MOVED`: `hash_slot` is served by `addr` from now on.
    pub fn moved(&mut self, hash_slot: u16, addr: &str) {
        let i = match self.nodes.iter().position(|n| n == addr) {
            Some(i) => i,
            None => {
                self.nodes.push(addr.to_string());
                self.nodes.len() - 1
            }
        };
        self.owner[hash_slot as usize] = i as u16;
    }
}

/// `(start, end, "host:port")` of one `CLUSTER SLOTS` entry.
fn parse_range(v: &Value) -> Option<(u16, u16, String)> {
    let Value::Array(items) = v else { return None };
    let int = |v: &Value| match v {
        Value::Int(i) => u16::try_from(*i).ok().filter(|&s| s < NR_HASH_SLOTS),
        _ => None,
    };
    let (start, end) = (int(items.first()?)?, int(items.get(1)?)?);
    let Value::Array(primary) = items.get(2)? else { return None };
    let host = match primary.first()? {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
        Value::SimpleString(s) => s.clone(),
        _ => return None,
    };
    let port = match primary.get(1)? {
        Value::Int(p) => u16::try_from(*p).ok()?,
        _ => return None,
    };
    (start <= end).then(|| (start, end, format!("{host}:{port}")))
}

/// Where a node sent a command for a key it does not serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redirect {
    /// The hash slot is served by `addr` now: update the map, send it there.
    Moved { hash_slot: u16, addr: String },
    /// The hash slot is migrating to `addr`: send this command there, after `ASKING`; the
    /// map stays as it is.
    Ask { hash_slot: u16, addr: String },
}

impl Redirect {
    /// The redirection an error reply says, if it is one (`MOVED 3999 127.0.0.1:6381`).
    pub fn of(e: &redis::RedisError) -> Option<Redirect> {
        let code = e.code()?;
        let detail = e.detail()?;
        let (slot, addr) = detail.trim().split_once(' ')?;
        let hash_slot = slot.parse::<u16>().ok().filter(|&s| s < NR_HASH_SLOTS)?;
        let addr = addr.trim().to_string();
        match code {
            "MOVED" => Some(Redirect::Moved { hash_slot, addr }),
            "ASK" => Some(Redirect::Ask { hash_slot, addr }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_slots_are_redis_clusters() {
        // The specification's check value, and slots `CLUSTER KEYSLOT` gives.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(hash_slot(b"foo"), 12182);
        assert_eq!(hash_slot(b"bar"), 5061);
        // Hash tags: the part in the first braces, when not empty.
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"{user1000}.followers"));
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        assert_eq!(hash_slot(b"foo{}{bar}"), hash_slot(b"foo{}{bar}"));
        assert_ne!(hash_slot(b"foo{}{bar}"), hash_slot(b"bar"), "an empty tag hashes the whole key");
        assert_eq!(hash_slot(b"foo{{bar}}zap"), hash_slot(b"{bar"));
    }

    #[test]
    fn runs_split_at_swap_cluster_boundaries() {
        let runs: Vec<_> = split_by_tag(510, 4).collect();
        assert_eq!(runs, vec![(510, 2), (512, 2)]);
        assert_eq!(split_by_tag(0, 512).collect::<Vec<_>>(), vec![(0, 512)]);
        assert_eq!(split_by_tag(7, 0).count(), 0);
        assert!(split_by_tag(100, 2000).all(|(s, n)| slot_tag(s) == slot_tag(s + n - 1)));
        assert_eq!(split_by_tag(100, 2000).map(|(_, n)| n).sum::<u64>(), 2000);
    }

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![Value::BulkString(host.into()), Value::Int(port), Value::BulkString(b"id".to_vec())])
    }

    #[test]
    fn a_slot_map_covers_every_hash_slot_or_is_refused() {
        let r = |a: i64, b: i64, port: i64| Value::Array(vec![Value::Int(a), Value::Int(b), node("127.0.0.1", port)]);
        let full = Value::Array(vec![r(0, 5460, 7000), r(5461, 10922, 7001), r(10923, 16383, 7002)]);
        let mut m = SlotMap::from_cluster_slots(&full).unwrap();
        assert_eq!(m.nodes, vec!["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"]);
        assert_eq!((m.node_of(0), m.node_of(5461), m.node_of(16383)), (0, 1, 2));
        m.moved(0, "127.0.0.1:7003");
        assert_eq!(m.nodes[m.node_of(0)], "127.0.0.1:7003");
        let gap = Value::Array(vec![r(0, 5460, 7000), r(10923, 16383, 7002)]);
        assert!(SlotMap::from_cluster_slots(&gap).unwrap_err().contains("hash slot 5461 has no primary"));
    }

    #[test]
    fn redirections_are_read_from_error_replies() {
        let parse = |s: &str| -> redis::RedisError {
            let mut p = redis::Parser::new();
            match p.parse_value(s.as_bytes()) {
                Ok(Value::ServerError(e)) => e.into(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            Redirect::of(&parse("-MOVED 3999 127.0.0.1:6381\r\n")),
            Some(Redirect::Moved { hash_slot: 3999, addr: "127.0.0.1:6381".into() })
        );
        assert_eq!(
            Redirect::of(&parse("-ASK 12 10.0.0.2:7000\r\n")),
            Some(Redirect::Ask { hash_slot: 12, addr: "10.0.0.2:7000".into() })
        );
        assert_eq!(Redirect::of(&parse("-ERR unknown command\r\n")), None);
    }
}
