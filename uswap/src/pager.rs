//! The pager: its builder (configuration checked, shared state built, threads started) and
//! the public handle. The state its threads work on is `crate::state::PagerShared`.
//!
//! A [`Pager`] owns one userfaultfd, its swap devices, its reclaim queues and counters, a
//! background reclaimer thread and, in thread mode, one fault-handler thread per CPU. Regions
//! created by `Pager::map` (in `region_handle`) are registered with its userfaultfd and
//! counted against its resident limit. Several pagers may live in one process, in either
//! mode.
//!
//! Ownership: `Pager` is a cheap handle (`Arc<PagerCore>`); every `Region` holds one, so the
//! threads stop only when the last handle *and* the last region are gone. The threads
//! themselves hold only `Arc<PagerShared>`, the state they work on.
//!
//! Locking: `threads` is a std mutex used only at start and shutdown; the shared state's
//! rules are `crate::state`'s.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::async_readahead::{AsyncReadahead, DEFAULT_ASYNC_WINDOWS, MAX_ASYNC_WINDOWS};
use crate::bounce::BounceBuffers;
use crate::device_config::DeviceConfig;
use crate::error::{Error, Result};
use crate::events::UnmapUnderWay;
use crate::fifo::Fifo;
use crate::lru::Lru;
use crate::mapping::{allowed_cpus, mincore_pages_where, nr_cpus_configured, spawn_engine_thread};
use crate::readahead::{DEFAULT_MAX_WINDOW_PAGES, MAX_WINDOW_PAGES};
use crate::region::{PageState, REGIONS};
use crate::shared_charge::{ChargeCell, DeviceShare, PoolShare, SharedCharge, TREE_DEVICES};
use crate::stats::{PerCpuStats, Stats};
use crate::swap::{DeviceSpec, SwapCache, SwapDevices, MAX_DEVICES, STAGING_REGISTER_MODE};
use crate::uffd::{self, Doorbell, OpenError, Uffd, PAGE_SIZE};
use crate::{events, fault};

pub use crate::options::{
    parse_tier_age, tier_age_from_secs, BackgroundReclaim, FaultMode, IdleAging, MAX_IDLE_AGE_SECS,
};

/// The most fault-handler threads a pager starts (thread mode): far more than serve at once
/// (a backlog brings up at most half the CPUs), and each is a thread with its own stack.
pub const MAX_HANDLER_THREADS: usize = 1024;
use crate::state::charge::Charge;
use crate::state::PagerShared;
pub use crate::state::{check_limit, PageError, PageErrorKind, MAX_LIMIT_BYTES, MIN_LIMIT_BYTES, RECLAIM_BATCH_PAGES};

/// Whether `devices` have a tier below the first, as a tier age needs
/// ([`PagerBuilder::tier_age`]): a device of lower priority than the highest.
pub fn check_tier_below(devices: &[DeviceConfig]) -> Result<()> {
    let highest = devices.iter().map(|d| d.priority_value()).max();
    if devices.iter().any(|d| Some(d.priority_value()) < highest) {
        Ok(())
    } else {
        Err(Error::NoTierBelow { nr_devices: devices.len() })
    }
}

/// Builds a [`Pager`].
#[derive(Debug, Clone)]
pub struct PagerBuilder {
    limit_bytes: Option<u64>,
    mode: FaultMode,
    devices: Vec<DeviceConfig>,
    handler_threads: Option<usize>,
    pin_handlers: bool,
    background_reclaim: BackgroundReclaim,
    readahead: bool,
    readahead_max_pages: usize,
    readahead_async_windows: usize,
    regions_survive_fork: bool,
    /// Built by `uswap run`'s own library (see [`PagerBuilder::run_library_host`]).
    run_library_host: bool,
    shared_charge: Option<(&'static SharedCharge, &'static AtomicUsize)>,
    own_pool_bytes: Option<&'static AtomicU64>,
    own_device_bytes: Option<&'static [AtomicU64; TREE_DEVICES]>,
    publish_stats: bool,
    auto_budget: Option<f64>,
    idle_aging: IdleAging,
    tier_age: Option<std::time::Duration>,
    syscall_guard: bool,
}

impl PagerBuilder {
    /// Bytes of application pages the pager keeps in RAM (mapped plus staged in its swap
    /// cache). Required.
    pub fn resident_limit(mut self, bytes: u64) -> Self {
        self.limit_bytes = Some(bytes);
        self
    }

    pub fn fault_mode(mut self, mode: FaultMode) -> Self {
        self.mode = mode;
        self
    }

    /// Adds a swap device. Call several times for several devices.
    pub fn device(mut self, device: DeviceConfig) -> Self {
        self.devices.push(device);
        self
    }

    /// Thread mode: number of fault-handler threads (default: one per CPU this process may
    /// run on, each pinned to its CPU). Not all of them serve at once: one starts, a backlog
    /// adds others (up to half the CPUs), and a handler whose wake-ups find nothing goes back
    /// to sleep (see docs/fault-modes.md). At most [`MAX_HANDLER_THREADS`]: `build` refuses
    /// more.
    pub fn handler_threads(mut self, n: usize) -> Self {
        self.handler_threads = Some(n.max(1));
        self
    }

    /// Thread mode: pin handler `i` to the `i`-th CPU this process may run on (default true).
    /// Pinned, a handler can be chosen by CPU: a lone serving handler hands over to the one
    /// pinned where the faulting thread runs, so that the hand-off stays on that CPU.
    pub fn pin_handlers(mut self, pin: bool) -> Self {
        self.pin_handlers = pin;
        self
    }

    /// Readahead on swap-in (default on). [`Pager::set_readahead`] changes it at run time;
    /// [`crate::Region::advise`] tunes it per region.
    pub fn readahead(mut self, on: bool) -> Self {
        self.readahead = on;
        self
    }

    /// Largest readahead window, in pages (default 32, at most 128). First-touch fault-around
    /// uses the same maximum.
    pub fn readahead_max_pages(mut self, pages: usize) -> Self {
        self.readahead_max_pages = pages.clamp(1, MAX_WINDOW_PAGES);
        self
    }

    /// Windows a sequential stream keeps in flight on devices that read asynchronously (file
    /// devices; see [`DeviceConfig::async_reads`]): while the application works through
    /// one window, the next `windows` are being read. Default 2, at most 4; 0 turns
    /// asynchronous readahead off.
    pub fn readahead_async_windows(mut self, windows: usize) -> Self {
        self.readahead_async_windows = windows.min(MAX_ASYNC_WINDOWS);
        self
    }

    /// Serve the pager's counters to `uswap stat` on the abstract unix socket
    /// `uswap.<pid>.<n>` (default true; see [`crate::stats_server`]). Only the process's
    /// user and root get an answer. A socket that cannot be set up is reported in
    /// `Stats::publish.error`; the pager works without it.
    pub fn publish_stats(mut self, on: bool) -> Self {
        self.publish_stats = on;
        self
    }

    /// Moves the resident limit by itself to the smallest that keeps the application's memory
    /// stalls under `target`, a share of wall time (`0.01`: 1 %; [`budget::DEFAULT_TARGET`]
    /// says why that is the default): the control law is [`budget::Budget`]'s, run once a
    /// second by the background reclaimer. The limit given with
    /// [`resident_limit`](Self::resident_limit) is the ceiling, and where it starts.
    /// [`Pager::resident_limit`] says where it is now. Not with a shared charge.
    ///
    /// [`budget::DEFAULT_TARGET`]: crate::budget::DEFAULT_TARGET
    /// [`budget::Budget`]: crate::budget::Budget
    pub fn auto_budget(mut self, target: f64) -> Self {
        self.auto_budget = Some(target);
        self
    }

    /// Idle aging (default [`IdleAging::Off`], or [`IdleAging::Observe`] with
    /// [`PagerBuilder::auto_budget`]): the background reclaimer moves resident pages to the
    /// swap cache a few at a time (every page once in 10 to 40 s, at most 16 MiB a second),
    /// so that a page the application no longer touches is seen as idle, counted in
    /// [`Stats::idle`](crate::Stats), and, with [`IdleAging::Evict`], written out once idle
    /// that long. A page in use comes back from the swap cache on its next touch (a
    /// swap-cache hit, a few microseconds). See docs/auto-budget.md, "Idle aging".
    pub fn idle_aging(mut self, aging: IdleAging) -> Self {
        self.idle_aging = aging;
        self
    }

    /// How long a page stays out of RAM untouched before it moves down a tier: from a device
    /// to one of lower priority ([`DeviceConfig::priority`]), such as an lz4 pool's page
    /// recompressed into a zstd pool below it, or a pool's page written to a file or Redis
    /// tier. The background reclaimer moves such pages off the fault path (up to 64 MiB a
    /// second), with any idle aging, [`IdleAging::Off`] included: a page's time out of RAM
    /// is stamped when it leaves. Default: twice the age of [`IdleAging::Evict`], never
    /// otherwise. The age is 1 s to a year ([`Error::BadTierAge`]), and the devices must
    /// have a tier below the first ([`Error::NoTierBelow`]).
    pub fn tier_age(mut self, age: std::time::Duration) -> Self {
        self.tier_age = Some(age);
        self
    }

    /// The tier age in effect: as given, or twice an evicting idle age.
    fn resolved_tier_age(&self) -> Option<std::time::Duration> {
        match (self.tier_age, self.idle_aging) {
            (Some(age), _) => Some(age),
            (None, IdleAging::Evict(age)) => Some(age * 2),
            (None, _) => None,
        }
    }

    /// For `uswap run`'s library (`uswap-preload`) alone: its pagers are the process's. Any
    /// other pager in a process where that library is loaded is refused
    /// ([`Error::UnderUswapRun`]): the library interposes the program's `mmap`, `ioctl` and
    /// signal handlers, so it would take the other engine's memory and faults for the
    /// program's.
    #[doc(hidden)]
    pub fn run_library_host(mut self) -> Self {
        self.run_library_host = true;
        self
    }

    /// When the background reclaimer works (default [`BackgroundReclaim::Auto`]).
    pub fn background_reclaim(mut self, policy: BackgroundReclaim) -> Self {
        self.background_reclaim = policy;
        self
    }

    /// Whether a child made by `fork()` inherits the regions (default: no, they are
    /// `MADV_DONTFORK` and absent in the child). With `true`, call [`Pager::prepare_fork`]
    /// before every fork (from a `pthread_atfork` prepare handler): the child then gets
    /// every page's contents, as ordinary memory that is no longer managed (its page tables
    /// are not the pager's).
    pub fn regions_survive_fork(mut self, on: bool) -> Self {
        self.regions_survive_fork = on;
        self
    }

    /// Puts the pager under a limit it shares with others, in this process or in others
    /// through shared memory: a page is charged only while `tree` stays within its
    /// `limit_pages`, and when `tree` is above its high watermark the pagers under it that
    /// hold at least an average share of it reclaim their own pages (every pager, unless
    /// `tree.nr_processes` counts them; see [`crate::shared_charge`]). The pager's own charge (its resident pages)
    /// is kept in `own_pages`, so that whoever outlives the process can give it back to
    /// `tree` if it dies without doing so. The pager's own limit still applies too.
    ///
    /// The pager's compressed pools report their memory to `tree` as well (its `pool_bytes`
    /// and `pool_peak_bytes`: the tree's pools at once, where summing each process's peak
    /// would count moments that never met).
    pub fn shared_charge(mut self, tree: &'static SharedCharge, own_pages: &'static AtomicUsize) -> Self {
        self.shared_charge = Some((tree, own_pages));
        self
    }

    /// With [`shared_charge`](Self::shared_charge): keeps the pager's share of the tree's
    /// pool memory in `own_pool_bytes`, so that whoever outlives the process can take it
    /// out of the tree's sum if the process dies without doing so.
    pub fn own_pool_bytes(mut self, own_pool_bytes: &'static AtomicU64) -> Self {
        self.own_pool_bytes = Some(own_pool_bytes);
        self
    }

    /// With [`shared_charge`](Self::shared_charge): keeps the pager's share of the storage
    /// of the tree's first [`TREE_DEVICES`] devices in `own_device_bytes`, as
    /// [`own_pool_bytes`](Self::own_pool_bytes) does for the pools. Under a shared charge
    /// the size of each of those devices is the tree's: what all the processes' devices at
    /// that place of the list hold together stays within it
    /// ([`crate::shared_charge::DeviceShare`]); and the cap of a compressed pool is the
    /// tree's pools' together.
    pub fn own_device_bytes(mut self, own_device_bytes: &'static [AtomicU64; TREE_DEVICES]) -> Self {
        self.own_device_bytes = Some(own_device_bytes);
        self
    }

    /// Signal mode: routes the C library's system calls through uswap, as `uswap run`'s
    /// library does (see [`crate::syscall_guard`]), so that a call into or from managed
    /// memory that is out (a `read`, a `recv` of a datagram, a `write`) brings it in first
    /// instead of failing with `EFAULT` (a datagram would be lost). Without it, a program
    /// that hands managed memory to the kernel in signal mode must call
    /// [`crate::prepare_user_access`] around each call, or use thread mode
    /// (docs/fault-modes.md). The C library's code is rewritten once per process, when the
    /// first pager asking for it is built: build it while the process has one thread (at the
    /// start of `main`), or `build` fails with [`Error::SyscallGuardThreads`]. Calls made
    /// outside the C library (a raw `syscall` instruction, statically linked code) are not
    /// covered. Ignored in thread mode, whose faults in system calls wait as any fault does.
    pub fn syscall_guard(mut self, on: bool) -> Self {
        self.syscall_guard = on;
        self
    }

    pub fn build(self) -> Result<Pager> {
        let limit_bytes = self.check()?;
        // Before the first reading a pager keeps: the C library's clock, not a preloaded one's.
        crate::clock::resolve();
        if self.syscall_guard && self.mode == FaultMode::Signal {
            install_syscall_guard()?;
        }
        // The engine's own set-up (a file device's io_uring, its files) is not the program's
        // calls: straight to the kernel, as `uswap run`'s library does around its builds.
        let _engine_calls = crate::syscall_guard::started().then(crate::syscall_guard::EngineCalls::enter);
        let uffd = open_uffd(self.mode, crate::syscall_guard::started())?;
        let nr_cpus = nr_cpus_configured();
        let (devices, async_readers, background_reclaim) = self.open_devices(nr_cpus)?;
        let async_ra = AsyncReadahead::new(
            self.readahead_async_windows,
            self.readahead_max_pages,
            |d| async_readers[d].then(|| devices.devices()[d].backend.async_reader(self.readahead_max_pages)).flatten(),
            devices.devices().len(),
        );
        let shared = Arc::new(self.shared_state(uffd, limit_bytes, nr_cpus, devices, async_ra, background_reclaim)?);
        let doorbell = Doorbell::new().map_err(|e| Error::io("creating the handler-thread doorbell (eventfd)", e))?;
        let publish = if self.publish_stats { publish_counters(&shared) } else { Publish::Off };
        let core = Arc::new(PagerCore {
            owner_pid: std::process::id(),
            shared: shared.clone(),
            threads: Mutex::new(Vec::new()),
            doorbell: Arc::new(doorbell),
            handler_pool: std::sync::OnceLock::new(),
            publish,
        });
        self.start_threads(&core)?;
        Ok(Pager { core })
    }

    /// The configuration's own checks, before anything is opened. Returns the limit.
    fn check(&self) -> Result<u64> {
        if !self.run_library_host && crate::mapping::run_library_loaded() {
            return Err(Error::UnderUswapRun);
        }
        let limit_bytes = self.limit_bytes.unwrap_or(0);
        crate::state::check_limit(limit_bytes)?;
        if self.devices.is_empty() {
            return Err(Error::NoDevice);
        }
        if let Some(target) = self.auto_budget {
            if !(target > 0.0 && target <= 0.5) {
                return Err(Error::BadStallTarget { target });
            }
            if self.shared_charge.is_some() {
                return Err(Error::AutoBudgetShared);
            }
        }
        if let IdleAging::Evict(age) = self.idle_aging {
            if age < std::time::Duration::from_secs(1) {
                return Err(Error::BadIdleAge { age_ms: age.as_millis() as u64 });
            }
        }
        if let Some(age) = self.tier_age {
            if !(1.0..=MAX_IDLE_AGE_SECS).contains(&age.as_secs_f64()) {
                return Err(Error::BadTierAge { age_ms: age.as_millis().min(u64::MAX as u128) as u64 });
            }
            check_tier_below(&self.devices)?;
        }
        if self.devices.len() > MAX_DEVICES {
            return Err(Error::TooManyDevices { given: self.devices.len(), max: MAX_DEVICES });
        }
        if let Some(given) = self.handler_threads.filter(|&n| n > MAX_HANDLER_THREADS) {
            return Err(Error::TooManyHandlerThreads { given, max: MAX_HANDLER_THREADS });
        }
        if self.mode == FaultMode::Signal {
            // Before anything is started: a signal-mode pager this thread cannot use, or whose
            // faults would not reach uswap, is an error now rather than a killed process later.
            check_signal_delivery()?;
        }
        Ok(limit_bytes)
    }

    /// Opens every device and builds the swap layer over them, its staging areas registered
    /// with their own descriptor. Returns the devices, which of them read asynchronously,
    /// and the background-reclaim policy (`Auto` resolved by the devices' writes).
    fn open_devices(&self, nr_cpus: usize) -> Result<(SwapDevices, Vec<bool>, BackgroundReclaim)> {
        let mut backends = Vec::with_capacity(self.devices.len());
        let mut async_readers = Vec::with_capacity(self.devices.len());
        for (index, d) in self.devices.iter().enumerate() {
            let backend = d.open()?;
            let mut tree_share = None;
            if let Some((tree, _)) = self.shared_charge {
                backend.share_pool(PoolShare::new(tree, self.own_pool_bytes));
                let size_bytes = backend.nr_slots() * crate::PAGE_SIZE as u64;
                tree_share = DeviceShare::new(tree, index, self.own_device_bytes, size_bytes);
            }
            backends.push(DeviceSpec {
                priority: d.priority_value(),
                backend,
                checksum: d.checksum_enabled(),
                readahead: d.readahead_policy(),
                clean_readahead: d.clean_readahead_enabled(),
                tree_share,
            });
            async_readers.push(d.async_reads_enabled());
        }
        let background_reclaim = match self.background_reclaim {
            BackgroundReclaim::Auto if backends.iter().any(|b| b.backend.slow_writes()) => BackgroundReclaim::Always,
            // Pages go to the first device; the others take what it declines or what ages
            // down a tier, which the background thread writes anyway.
            BackgroundReclaim::Auto
                if backends.iter().max_by_key(|b| b.priority).is_some_and(|b| b.backend.dear_writes()) =>
            {
                BackgroundReclaim::StageTwo
            }
            BackgroundReclaim::Auto => BackgroundReclaim::WhenIdle,
            policy => policy,
        };
        // The staging areas (a page of address space a slot) are most of what is mapped here.
        let slots_bytes: u64 = backends.iter().map(|b| b.backend.nr_slots() * crate::PAGE_SIZE as u64).sum();
        let devices = SwapDevices::new(backends, nr_cpus).map_err(|e| Error::OutOfAddressSpace {
            what: "the swap devices' staging areas and slot tables".into(),
            len_bytes: slots_bytes,
            source: e,
        })?;
        Ok((devices, async_readers, background_reclaim))
    }

    /// The state the pager's handle, regions and threads share.
    fn shared_state(
        &self,
        uffd: Uffd,
        limit_bytes: u64,
        nr_cpus: usize,
        devices: SwapDevices,
        async_ra: AsyncReadahead,
        background_reclaim: BackgroundReclaim,
    ) -> Result<PagerShared> {
        let staging_uffd = register_staging(&devices)?;
        let limit_pages = (limit_bytes / PAGE_SIZE as u64) as usize;
        // Room for every resident page twice over (stale entries linger until popped); a
        // page that finds the queue full is counted and later found by a scan. No more
        // resident pages than the machine's RAM holds: a limit far above it is never reached.
        let ram_pages = crate::mapping::ram_bytes().map_or(usize::MAX, |b| (b / PAGE_SIZE as u64) as usize);
        let queue_len = (4 * limit_pages.min(ram_pages)).max(1 << 16);
        let fifo = || {
            Fifo::new(queue_len).map_err(|e| Error::OutOfAddressSpace {
                what: "a reclaim queue".into(),
                len_bytes: (queue_len * 16) as u64,
                source: e,
            })
        };
        let without_remove_events = (!uffd.sends_remove_events()).then(crate::state::events::WithoutRemoveEvents::new);
        Ok(PagerShared {
            uffd,
            mode: self.mode,
            charge: self.initial_charge(limit_pages),
            parent: crate::state::Parent::default(),
            regions_survive_fork: self.regions_survive_fork,
            clean_pages: AtomicUsize::new(0),
            clean_bets: crate::state::clean_bets::CleanBets::new(),
            devices,
            lru: Lru::new(fifo()?, fifo()?),
            swap_cache: SwapCache::new(staging_uffd, fifo()?),
            stats: PerCpuStats::new(nr_cpus),
            bounce: self.bounce_buffers(nr_cpus)?,
            readahead: AtomicBool::new(self.readahead),
            readahead_max_pages: self.readahead_max_pages,
            async_ra,
            shutdown: crate::state::Shutdown::default(),
            background_reclaim,
            idle_aging: match (self.idle_aging, self.auto_budget) {
                (IdleAging::Off, Some(_)) => IdleAging::Observe,
                (aging, _) => aging,
            },
            tier_age: self.resolved_tier_age(),
            errors: crate::state::ErrorLog::new(ERROR_LOG_LEN),
            reclaimer: crate::sync::Doze::new(),
            cow: crate::state::cow::CowQueue::new(),
            events: crate::state::events::EventState {
                _without_remove_events: without_remove_events,
                ..Default::default()
            },
        })
    }

    /// The pager's charge, nothing charged yet, against a limit of `limit_pages` (and the
    /// tree's, if it shares one).
    fn initial_charge(&self, limit_pages: usize) -> Charge {
        Charge {
            limit_pages: AtomicUsize::new(limit_pages),
            resident_pages: match self.shared_charge {
                Some((_, own)) => ChargeCell::Shared(own),
                None => ChargeCell::Own(AtomicUsize::new(0)),
            },
            shared: self.shared_charge.map(|(t, _)| t),
            resident_peak_pages: AtomicUsize::new(0),
            reclaim_held: AtomicBool::new(false),
            reclaim_in_flight: AtomicUsize::new(0),
            stall: crate::pressure::StallClock::new(),
            stall_avgs: crate::pressure::StallAverages::default(),
            idle_sample: crate::budget::IdleSample::new(),
            aged_written_pages: std::sync::atomic::AtomicU64::new(0),
            aged_cohort_epoch: std::sync::atomic::AtomicU64::new(0),
            auto: self.auto_budget.map(|target| {
                crate::budget::Budget::new(target, (MIN_LIMIT_BYTES / PAGE_SIZE as u64) as usize, limit_pages)
            }),
            auto_ceiling_pages: AtomicUsize::new(limit_pages),
        }
    }

    /// The bounce buffers: each holds a readahead window.
    fn bounce_buffers(&self, nr_cpus: usize) -> Result<BounceBuffers> {
        BounceBuffers::new(4 * nr_cpus.max(4), self.readahead_max_pages).map_err(|e| Error::OutOfAddressSpace {
            what: "bounce buffers".into(),
            len_bytes: (4 * nr_cpus.max(4) * self.readahead_max_pages * crate::PAGE_SIZE) as u64,
            source: e,
        })
    }

    /// Starts the pager's threads: the background reclaimer, and the fault handlers (thread
    /// mode) or the event reader with the SIGBUS handler installed (signal mode).
    fn start_threads(&self, core: &PagerCore) -> Result<()> {
        let shared = &core.shared;
        let mut threads = core.threads.lock().unwrap_or_else(|e| e.into_inner());
        let s = shared.clone();
        let reclaimer = spawn_engine_thread("uswap-reclaim".into(), move || {
            s.uffd.keeper().witness_this_engine_thread();
            s.reclaim_cx().run_background()
        })
        .map_err(|e| Error::io("starting the reclaimer thread", e))?;
        threads.push(reclaimer);
        if !self.run_library_host {
            // A program may close every descriptor above 2 (`uswap run`'s library keeps it
            // from closing the engine's): see `fd::Keeper`.
            shared.uffd.keeper().witness_this_thread();
            let (s, bell) = (shared.clone(), core.doorbell.raw_fd());
            threads.push(
                spawn_engine_thread("uswap-keeper".into(), move || s.uffd.keeper().hold(s.uffd.raw_fd(), bell))
                    .map_err(|e| Error::io("starting the descriptor keeper thread", e))?,
            );
            shared.uffd.keeper().wait_until_held();
        }
        match self.mode {
            FaultMode::Thread => {
                let cpus = allowed_cpus();
                let n = self.handler_threads.unwrap_or(cpus.len().max(1));
                // Pin handler i to the i-th allowed CPU (round robin when there are more
                // handlers than CPUs): a handler on the faulting CPU is woken locally.
                let handler_cpus: Vec<Option<usize>> = (0..n)
                    .map(|i| if self.pin_handlers { cpus.get(i % cpus.len().max(1)).copied() } else { None })
                    .collect();
                let pool = Arc::new(crate::fault::handler_pool::HandlerPool::new(handler_cpus.clone(), cpus.len()));
                let _ = core.handler_pool.set(pool.clone());
                for (i, cpu) in handler_cpus.into_iter().enumerate() {
                    let (s, bell, pool) = (shared.clone(), core.doorbell.clone(), pool.clone());
                    threads.push(
                        spawn_engine_thread(format!("uswap-fault-{i}"), move || {
                            fault::handler_thread(&s.handler_cx(), &bell, &pool, i, cpu)
                        })
                        .map_err(|e| Error::io("starting a fault-handler thread", e))?,
                    );
                }
            }
            FaultMode::Signal => {
                // Stacks for the handler's work (see `mapping::handler_stack`).
                crate::mapping::handler_stack::reserve();
                uffd::sigbus::install(fault::sigbus_fault)
                    .map_err(|e| Error::io("installing the SIGBUS handler", e))?;
                // Faults come as signals, but munmap/mremap/madvise events still come as
                // messages, and the thread that caused one waits until it is read.
                let (s, bell) = (shared.clone(), core.doorbell.clone());
                threads.push(
                    spawn_engine_thread("uswap-events".into(), move || events::event_thread(&s.events_cx(), &bell))
                        .map_err(|e| Error::io("starting the event thread", e))?,
                );
            }
        }
        Ok(())
    }
}

/// Rewrites the C library's system calls once per process ([`PagerBuilder::syscall_guard`]).
fn install_syscall_guard() -> Result<()> {
    // Serialises two builders racing (the second finds the guard started).
    static INSTALL: Mutex<()> = Mutex::new(());
    let _one = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    crate::syscall_guard::install().map_err(|e| match e {
        crate::syscall_guard::InstallError::Threads(threads) => Error::SyscallGuardThreads { threads },
        crate::syscall_guard::InstallError::Patch(e) => Error::SyscallGuard { why: e.to_string() },
    })
}

/// Once uswap's SIGBUS handler is installed, it must still be the process's.
pub(crate) fn check_sigbus_handler() -> Result<()> {
    if uffd::sigbus::installed()
        && !uffd::sigbus::handler_is_ours().map_err(|e| Error::io("reading the SIGBUS action", e))?
    {
        return Err(Error::SigbusHandlerReplaced);
    }
    Ok(())
}

/// Signal mode's two preconditions (see [`Pager::check_signal_delivery`]).
fn check_signal_delivery() -> Result<()> {
    check_sigbus_handler()?;
    if uffd::sigbus::blocked_in_this_thread() {
        return Err(Error::SigbusBlocked);
    }
    Ok(())
}

/// The regions' descriptor. What the application does to a region (munmap, mremap,
/// MADV_DONTNEED) reaches the engine as events (see `events`), but for discards in signal
/// mode under the system-call guard (`guarded`): the guard sees the program's `madvise`
/// and `process_madvise` itself and tells the engine before they return
/// ([`crate::events::ProgramDiscard`]). A `REMOVE` event made the discarding thread wait for
/// the event thread to read it (20-80 µs), and made every discard of the engine's own on a
/// region one such wait, so reclaim could not drop a clean page where it lies: without
/// them it drops a round's clean victims with one TLB flush (`reclaim::swapout`).
fn open_uffd(mode: FaultMode, guarded: bool) -> Result<Uffd> {
    let remove_events = if mode == FaultMode::Signal && guarded { 0 } else { uffd::FEATURE_EVENT_REMOVE };
    let features = uffd::FEATURE_MOVE
        | uffd::FEATURE_EVENT_UNMAP
        | uffd::FEATURE_EVENT_REMAP
        | remove_events
        | match mode {
            FaultMode::Signal => uffd::FEATURE_SIGBUS,
            // The faulting thread's id, to deliver SIGBUS to it if its page is lost.
            FaultMode::Thread => uffd::FEATURE_THREAD_ID,
        };
    // Signal mode only ever sees user-mode faults, so it may use UFFD_USER_MODE_ONLY, which
    // unprivileged users get even with vm.unprivileged_userfaultfd=0.
    Uffd::open(features, true, mode == FaultMode::Signal).map_err(open_error)
}

/// The swap cache's own descriptor, which asks for no events (see `swap::swap_cache` for
/// why), with every device's staging area registered (for write-protect faults only: see
/// [`STAGING_REGISTER_MODE`]).
fn register_staging(devices: &SwapDevices) -> Result<Uffd> {
    let staging_uffd = open_staging_uffd()?;
    for d in devices.devices() {
        let (addr, len) = d.staging_range();
        staging_uffd
            .register(addr, len, STAGING_REGISTER_MODE)
            .map_err(|e| Error::io("registering the swap staging area with userfaultfd", e))?;
    }
    Ok(staging_uffd)
}

/// SIGBUS: a write-protect fault in a staging area (none is expected) fails loudly instead of
/// waiting for a reader that never comes.
fn open_staging_uffd() -> Result<Uffd> {
    Uffd::open(uffd::FEATURE_MOVE | uffd::FEATURE_SIGBUS, true, true)
        .map(Uffd::with_zero_page_destinations)
        .map_err(open_error)
}

pub(crate) fn open_error(e: OpenError) -> Error {
    match e {
        OpenError::Denied { syscall, dev } => Error::UserfaultfdDenied { syscall, dev },
        OpenError::Unsupported(source) => Error::UserfaultfdUnsupported { source },
        OpenError::MissingFeatures { wanted, available } => {
            Error::KernelTooOld { release: uffd::kernel_release(), missing: feature_names(wanted & !available) }
        }
        OpenError::NoDescriptors(e) => Error::io(
            "cannot open a userfaultfd: no file descriptor left (raise the limit, ulimit -n, or close descriptors)",
            e,
        ),
        OpenError::Other(e) => Error::io("userfaultfd handshake (UFFDIO_API)", e),
    }
}

fn feature_names(bits: u64) -> String {
    let names = [
        (uffd::FEATURE_MOVE, "UFFD_FEATURE_MOVE"),
        (uffd::FEATURE_SIGBUS, "UFFD_FEATURE_SIGBUS"),
        (uffd::FEATURE_WP_ASYNC, "UFFD_FEATURE_WP_ASYNC"),
        (uffd::FEATURE_EVENT_UNMAP, "UFFD_FEATURE_EVENT_UNMAP"),
        (uffd::FEATURE_EVENT_REMAP, "UFFD_FEATURE_EVENT_REMAP"),
        (uffd::FEATURE_EVENT_REMOVE, "UFFD_FEATURE_EVENT_REMOVE"),
    ];
    let v: Vec<&str> = names.iter().filter(|(b, _)| bits & b != 0).map(|(_, n)| *n).collect();
    if v.is_empty() {
        format!("features {bits:#x}")
    } else {
        v.join(", ")
    }
}

/// Recent page errors kept for `Pager::recent_errors`.
const ERROR_LOG_LEN: usize = 64;

/// Serves the pager's counters to `uswap stat` on a fresh socket name; a failure is kept and
/// reported in the counters, not fatal.
fn publish_counters(shared: &Arc<PagerShared>) -> Publish {
    let name = crate::stats_server::next_socket_name();
    let s = shared.clone();
    // No flush of the per-CPU free batches: they are the fault path's (module doc).
    match crate::stats_server::serve(&name, move || s.snapshot(false)) {
        Ok(server) => Publish::Serving(server),
        Err(e) => Publish::Failed(format!("cannot serve the counters on @{name}: {e}")),
    }
}

/// Whether and where the pager's counters are published.
enum Publish {
    Off,
    Serving(crate::stats_server::StatsServer),
    Failed(String),
}

struct PagerCore {
    /// The process that built the pager: its threads, its userfaultfd and (unless regions
    /// survive fork) its regions and tables are that process's only.
    owner_pid: u32,
    shared: Arc<PagerShared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    doorbell: Arc<Doorbell>,
    /// Thread mode's handlers, for waking the dormant ones at shutdown.
    handler_pool: std::sync::OnceLock<Arc<crate::fault::handler_pool::HandlerPool>>,
    publish: Publish,
}

impl Drop for PagerCore {
    fn drop(&mut self) {
        if std::process::id() != self.owner_pid {
            // A fork child's copy: the threads to stop and join (and the publisher's) are
            // the parent's, and their handles name threads this process does not have.
            std::mem::forget(std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner())));
            std::mem::forget(std::mem::replace(&mut self.publish, Publish::Off));
            return;
        }
        // First: the socket goes with its thread, and no snapshot runs during the teardown.
        self.publish = Publish::Off;
        self.shared.shutdown.set();
        let keeper = self.shared.uffd.keeper();
        if !keeper.is_held() {
            // With a keeper, it rings its own copy: the number may be the program's file.
            self.doorbell.ring();
        }
        keeper.shut_down();
        self.shared.reclaimer.wake();
        if let Some(pool) = self.handler_pool.get() {
            pool.wake_all();
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            // Never an error: an engine thread that panics aborts the process
            // (`spawn_engine_thread`).
            let _ = t.join();
        }
        if keeper.bell_number_lost() {
            self.doorbell.give_up_number();
        }
    }
}

/// A user-space swap engine: regions with a resident cap, paged through userfaultfd to its
/// swap devices. `Send + Sync`; clone it freely (clones share the engine).
#[derive(Clone)]
pub struct Pager {
    core: Arc<PagerCore>,
}

impl std::fmt::Debug for Pager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.core.shared;
        f.debug_struct("Pager")
            .field("mode", &s.mode)
            .field("limit_pages", &s.charge.limit_pages.load(Ordering::Relaxed))
            .field("resident_pages", &s.charge.resident_pages.load(Ordering::Relaxed))
            .finish()
    }
}

impl Pager {
    pub fn builder() -> PagerBuilder {
        PagerBuilder {
            limit_bytes: None,
            mode: FaultMode::default(),
            devices: Vec::new(),
            handler_threads: None,
            pin_handlers: true,
            background_reclaim: BackgroundReclaim::default(),
            readahead: true,
            readahead_max_pages: DEFAULT_MAX_WINDOW_PAGES,
            readahead_async_windows: DEFAULT_ASYNC_WINDOWS,
            regions_survive_fork: false,
            run_library_host: false,
            shared_charge: None,
            own_pool_bytes: None,
            own_device_bytes: None,
            publish_stats: true,
            auto_budget: None,
            idle_aging: IdleAging::Off,
            tier_age: None,
            syscall_guard: false,
        }
    }

    pub(crate) fn shared(&self) -> &PagerShared {
        &self.core.shared
    }

    /// Fails in a process other than the one that built the pager (a fork child): the
    /// engine's threads, its userfaultfd and, unless regions survive fork, its tables are
    /// not there, and a call that reclaims or maps would fault inside the engine. [`Pager::map`]
    /// and [`Pager::set_resident_limit`] check it; [`Pager::stats`], which cannot fail, does
    /// not (its flush of freed slots writes tables a fork child does not have): a binding that
    /// hands the pager to code that may run in a fork child checks it first.
    pub fn check_owner(&self) -> Result<()> {
        let pid = std::process::id();
        if pid == self.core.owner_pid {
            return Ok(());
        }
        Err(Error::ForkChild { owner_pid: self.core.owner_pid, pid })
    }

    /// Whether this is the process that built the pager (see [`Pager::check_owner`]).
    pub(crate) fn in_owner(&self) -> bool {
        std::process::id() == self.core.owner_pid
    }

    /// The engine state, shared (a new region holds it).
    pub(crate) fn shared_arc(&self) -> &Arc<PagerShared> {
        &self.core.shared
    }

    /// A snapshot of the counters. Flushes the per-CPU batches of freed slots first, so the
    /// per-device slot counts are exact at the moment of the call.
    pub fn stats(&self) -> Stats {
        let _signals = crate::uffd::AsyncSignalsBlocked::new();
        let mut st = self.core.shared.snapshot(true);
        st.publish = match &self.core.publish {
            Publish::Off => Default::default(),
            Publish::Serving(server) => server.publish_stats(),
            Publish::Failed(error) => crate::stats::PublishStats { error: Some(error.clone()), ..Default::default() },
        };
        st
    }

    /// The abstract unix socket this pager's counters are served on (`uswap.<pid>.<n>`, see
    /// [`crate::stats_server`]); `None` when publishing is off or failed.
    pub fn stats_socket(&self) -> Option<&str> {
        match &self.core.publish {
            Publish::Serving(server) => Some(server.name()),
            _ => None,
        }
    }

    /// The resident limit in bytes.
    pub fn resident_limit(&self) -> u64 {
        (self.core.shared.charge.limit_pages.load(Ordering::Acquire) * PAGE_SIZE) as u64
    }

    /// Whether `bytes` more resident would leave this pager, and the tree it shares a charge
    /// with, at most a quarter of the way to their limits (the tree's goal, if its budget set
    /// one), with nothing of this pager's on its devices and no automatic budget of its own.
    /// Memory a program frees can then stay resident rather than be given back: each range
    /// given back is a fault per page when it is used again, and in thread mode an
    /// `UFFD_EVENT_REMOVE` the giving thread waits for the engine to read (20-80 µs here;
    /// signal mode under the guard applies the discard in the call, about 5 µs). (A range kept while
    /// some of its pages were out would keep their slots, and their old contents would come
    /// back on reuse.) No lock, no allocation.
    pub fn far_below_limit(&self, bytes: usize) -> bool {
        let shared = &self.core.shared;
        let charge = &shared.charge;
        if charge.auto.is_some() || shared.devices.devices().iter().any(|d| d.inuse_slots() != 0) {
            return false;
        }
        let pages = bytes.div_ceil(PAGE_SIZE);
        let under = |resident: usize, limit: usize| resident.saturating_add(pages).saturating_mul(4) <= limit;
        under(charge.resident_pages.load(Ordering::Acquire), charge.limit_pages.load(Ordering::Acquire))
            && charge.shared.is_none_or(|t| under(t.resident_pages.load(Ordering::Acquire), t.reclaim_goal_pages()))
    }

    /// Changes the resident limit. A lower limit takes effect at once: the caller reclaims
    /// down to it before this returns. Fails (with the new limit in place) with
    /// [`Error::LimitNotReached`] if the devices are full and the pages cannot go anywhere,
    /// or [`Error::LimitBusy`] if for 2 s every page reclaim found was busy in other
    /// threads' faults or device writes.
    pub fn set_resident_limit(&self, bytes: u64) -> Result<()> {
        crate::state::check_limit(bytes)?;
        self.check_owner()?;
        let _signals = crate::uffd::AsyncSignalsBlocked::new();
        // The reclaim below is the engine's, on the caller's thread: with the system-call
        // guard its calls go straight to the kernel (taken for the program's, one could wait
        // for a page this thread holds busy, see `user_access::in_preparation`).
        let _engine_calls = crate::syscall_guard::started().then(crate::syscall_guard::EngineCalls::enter);
        let s = &self.core.shared;
        let limit_pages = (bytes / PAGE_SIZE as u64) as usize;
        // With an automatic budget the limit given is its new ceiling: the budget moves the
        // limit under it from here (it would otherwise take the old ceiling back next tick).
        s.charge.auto_ceiling_pages.store(limit_pages, Ordering::Release);
        s.charge.limit_pages.store(limit_pages, Ordering::Release);
        s.reclaim_cx().reclaim_to_limit()
    }

    /// Application pages of this pager mapped in RAM right now (regions plus staged pages),
    /// measured from the page tables with `mincore(2)`, not from the engine's counters, less
    /// the pages mapped shared and uncharged (`PageState::Shared`: the kernel's zero page
    /// for a read of memory never written, a fork parent's page).
    ///
    /// Exact while no page moves. Pages move both ways while threads fault (reclaim stages
    /// them, a swap-cache hit takes one back), and no scan sees every page table at one
    /// instant. So the staging areas are scanned before and after the regions, and a staged
    /// page counts only if both scans saw it: a page that moved during the scan counts once,
    /// or (moved between the first staging scan and its region's scan, either way) not at
    /// all; never twice. A single scan counted a page moving staging → region in both places,
    /// and sampled every few milliseconds under four faulting threads it read up to 149
    /// pages over a limit the engine held.
    pub fn measured_resident_pages(&self) -> std::io::Result<usize> {
        let s: &PagerShared = &self.core.shared;
        let before =
            s.devices.devices().iter().map(|d| d.staging_resident_bitmap()).collect::<std::io::Result<Vec<_>>>()?;
        let mut total = 0;
        let mut err = None;
        REGIONS.for_each(|r| {
            if std::ptr::eq(&*r.pager, s) {
                // Pages the application unmapped are not the region's any more.
                for (first, end) in r.live_runs() {
                    // Shared pages (the zero page, a fork parent's) hold no memory of ours.
                    let own = |i: usize| r.load(first + i).state() != PageState::Shared;
                    match mincore_pages_where(r.page_addr(first), (end - first) * PAGE_SIZE, own) {
                        Ok(n) => total += n,
                        Err(e) => err = Some(e),
                    }
                }
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        for (d, before) in s.devices.devices().iter().zip(&before) {
            let after = d.staging_resident_bitmap()?;
            assert_eq!(after.len(), before.len(), "a staging area keeps its size");
            total += before.iter().zip(&after).map(|(b, a)| (b & a).count_ones() as usize).sum::<usize>();
        }
        Ok(total)
    }

    /// The most recent page errors (failed reads, checksum mismatches), oldest first. The
    /// engine retries each; a page that fails every attempt ends in SIGBUS for its thread.
    pub fn recent_errors(&self) -> Vec<PageError> {
        self.core.shared.errors.recent()
    }

    /// Turns readahead on or off for every region of this pager.
    pub fn set_readahead(&self, on: bool) {
        self.core.shared.readahead.store(on, Ordering::Relaxed);
    }

    /// Signal mode: whether faults on managed pages taken by the calling thread can be served.
    /// Fails with [`Error::SigbusHandlerReplaced`] if SIGBUS was given another handler after
    /// the pager was built, and with [`Error::SigbusBlocked`] if this thread blocks SIGBUS
    /// (a fault would kill the process). Call it from threads you create with their own
    /// signal masks. Always `Ok` in thread mode, which has neither limit.
    pub fn check_signal_delivery(&self) -> Result<()> {
        match self.core.shared.mode {
            FaultMode::Thread => Ok(()),
            FaultMode::Signal => check_signal_delivery(),
        }
    }

    pub fn fault_mode(&self) -> FaultMode {
        self.core.shared.mode
    }

    /// For a caller that unmaps part of a managed mapping with `munmap` itself (a program's
    /// call, seen by an interposer): hold the result from before the system call until it
    /// returned. Dropping it waits until the `UNMAP` event the call sent is applied (at most
    /// a second); until then, no new region of any pager is entered in the registry, where a
    /// late `UNMAP` for the same addresses would take its pages (see
    /// `events::UnmapUnderWay`). Asynchronous signals are blocked while it is held. Take one
    /// from each pager whose regions the range overlaps, and map nothing while holding it
    /// (the new region would wait its full bound for this very unmap).
    pub fn unmap_under_way(&self) -> UnmapUnderWay<'_> {
        let shared = &self.core.shared;
        UnmapUnderWay::begin(&shared.events, &shared.stats)
    }

    /// When this pager's background reclaimer works: the builder's policy, with
    /// [`BackgroundReclaim::Auto`] resolved for its devices (never `Auto`).
    pub fn background_reclaim(&self) -> BackgroundReclaim {
        self.core.shared.background_reclaim
    }
}
