//! The choices a user makes for a pager: how faults reach the engine ([`FaultMode`]), when
//! the background reclaimer works ([`BackgroundReclaim`]) and whether idle pages are looked
//! for ([`IdleAging`]). Plain values, at the bottom of the layers: the builder takes them,
//! the services read them from the shared state.

/// How faults on managed regions reach the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FaultMode {
    /// Handler threads read the userfaultfd, one pinned to each CPU so the wake-up stays on
    /// the faulting CPU. Faults raised inside system calls (e.g. `read(2)` into a managed
    /// buffer) work. The default.
    #[default]
    Thread,
    /// `UFFD_FEATURE_SIGBUS`: the faulting thread serves its own fault in a SIGBUS handler.
    /// Fastest (no cross-thread wake-up), but a system call that touches a page that is not
    /// resident fails with `EFAULT` instead of waiting for it (a datagram socket loses the
    /// datagram) unless [`crate::prepare_user_access`] brought it in first (`uswap run`'s
    /// library does, for every call of the C library), threads that touch managed memory must not block SIGBUS and need 128 KiB of
    /// stack, and a SIGBUS handler must be installed before the pager. See docs/fault-modes.md.
    Signal,
}

impl FaultMode {
    /// Whether the threads that fault sleep until an ioctl wakes them (thread mode).
    pub(crate) fn wakes(self) -> bool {
        self == FaultMode::Thread
    }
}

/// When the background reclaimer works.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackgroundReclaim {
    /// The default: [`Always`](Self::Always) when a device's writes are slow
    /// (`Backend::slow_writes`: the file device, a disk write; the Redis tier, a network
    /// round trip; the faulting thread should not wait for either),
    /// [`StageTwo`](Self::StageTwo) when the first device's writes are dear
    /// (`Backend::dear_writes`: a zstd pool's compression), [`WhenIdle`](Self::WhenIdle)
    /// otherwise (RAM and the lz4 pool). Resolved when the pager is built.
    #[default]
    Auto,
    /// Only while the application takes no faults. While it faults, reclaim runs in the
    /// faulting context: on VMs, `UFFDIO_MOVE` from another CPU interrupts the faulting CPU
    /// with a TLB-shootdown IPI for every page moved (see docs/design.md, "Where measurements changed the design").
    WhenIdle,
    /// Classic kswapd: woken at the high watermark, reclaims down to the low one whatever the
    /// application does; faults reclaim only at the limit. What [`Auto`](Self::Auto) picks
    /// for a device with slow writes; otherwise for comparison and for machines where
    /// cross-CPU TLB flushes are cheap.
    Always,
    /// As [`WhenIdle`](Self::WhenIdle), but while the application faults, its faults only
    /// move victims out of their regions into the swap cache (stage one of a swap-out) and
    /// this thread writes them to their device (stage two: a zstd pool's compression, 3-5x
    /// lz4's), so that the program's CPU does not compress. The moves stay in the faulting
    /// context (no shootdown of the program's CPU for each, as with `Always`); this thread's
    /// writes drop their staging pages a batch at a time, one flush per batch. A fault that
    /// reaches the limit writes itself, as with `WhenIdle`. What
    /// [`Auto`](Self::Auto) picks when the first device's writes are dear.
    StageTwo,
}

/// Idle aging: whether the pager looks for pages its application no longer touches, and
/// what it does with them (see `crate::reclaim::aging`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdleAging {
    /// No scan: only reclaim moves pages out, so the idle-age histogram counts only the
    /// pages reclaim took. The default, unless an automatic budget is asked for.
    #[default]
    Off,
    /// Resident pages are moved to the swap cache a few at a time and counted idle until
    /// touched (the histogram then covers all managed memory), but nothing is written out
    /// for its age: reclaim takes the longest idle first. What an automatic budget uses.
    Observe,
    /// As `Observe`, and a page untouched for this long is written to the first device
    /// without waiting for the limit; one untouched for this long again on a device that
    /// has a tier below goes on down.
    Evict(std::time::Duration),
}

/// Parses a tier age as `uswap run --tier-age` and `USWAP_TIER_AGE` take it (see
/// `PagerBuilder::tier_age`): seconds, or with a unit (`30s`, `2m`, `1h`), 1 s to a year.
pub fn parse_tier_age(s: &str) -> Result<std::time::Duration, String> {
    match IdleAging::parse(s) {
        Ok(IdleAging::Evict(age)) => Ok(age),
        _ => Err(format!("{s:?}: a tier age is 1 s to a year (8760h), such as 30s, 2m or 1h")),
    }
}

/// A tier age in seconds, as the C and Python APIs take it: 1 s to [`MAX_IDLE_AGE_SECS`],
/// `None` for anything else (the range of an evicting idle age).
pub fn tier_age_from_secs(secs: f64) -> Option<std::time::Duration> {
    match IdleAging::from_secs(secs) {
        Some(IdleAging::Evict(age)) => Some(age),
        _ => None,
    }
}

/// The longest idle age a pager evicts at: a year, in seconds. Longer is what `never`
/// (observe) says, and past about 10^19 s a `Duration` cannot hold it.
pub const MAX_IDLE_AGE_SECS: f64 = 365.0 * 24.0 * 3600.0;

impl IdleAging {
    /// The aging an idle age in seconds asks for, as the C and Python APIs and `uswap run
    /// --idle-age` take it: 0 off, infinity observe, 1 s to [`MAX_IDLE_AGE_SECS`] evict at
    /// that age. `None` for anything else (negative, NaN, under a second, over a year).
    pub fn from_secs(secs: f64) -> Option<IdleAging> {
        if secs == 0.0 {
            Some(IdleAging::Off)
        } else if secs == f64::INFINITY {
            Some(IdleAging::Observe)
        } else if (1.0..=MAX_IDLE_AGE_SECS).contains(&secs) {
            Some(IdleAging::Evict(std::time::Duration::from_secs_f64(secs)))
        } else {
            None
        }
    }

    /// Parses an idle age as `uswap run --idle-age` and `USWAP_IDLE_AGE` take it: a number of
    /// seconds, or one with a unit (`90s`, `2m`, `1h`), `never` (look, send nothing out for
    /// its age) or `off`.
    pub fn parse(s: &str) -> Result<IdleAging, String> {
        let t = s.trim();
        let secs = match t {
            "never" => f64::INFINITY,
            "off" => 0.0,
            _ => {
                let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
                    Some(i) => t.split_at(i),
                    None => (t, "s"),
                };
                let scale = match unit {
                    "s" => 1.0,
                    "m" | "min" => 60.0,
                    "h" => 3600.0,
                    _ => {
                        return Err(format!(
                            "{s:?}: unknown unit {unit:?}; give seconds (90s), minutes (2m) or hours (1h)"
                        ))
                    }
                };
                num.trim()
                    .parse::<f64>()
                    .map_err(|_| format!("{s:?} is not an age: give one such as 90s, 2m or never"))?
                    * scale
            }
        };
        IdleAging::from_secs(secs)
            .ok_or_else(|| format!("{s:?}: an idle age is 1 s to a year (8760h), or never, or off (0)"))
    }
}
